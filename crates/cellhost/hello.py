print('hi from file')
