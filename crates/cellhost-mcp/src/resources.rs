//! The session's workspace as MCP resources: `resources/list` lists its
//! files (recursive, bounded) as `cellhost://workspace/<path>`, and
//! `resources/read` answers one as text (UTF-8 text types) or as a
//! base64 blob. Both go through the library's workspace handle, so the
//! path rules are the HTTP routes' own.

use base64::Engine;
use cellhost::files::{EntryType, Opened, Workspace};
use rmcp::model::{ListResourcesResult, ReadResourceResult, Resource, ResourceContents};
use rmcp::ErrorData;

/// The URI prefix of a workspace file.
pub(crate) const PREFIX: &str = "cellhost://workspace/";
/// Most files listed.
const MAX_LISTED: usize = 1000;
/// Largest file read as a resource (bigger ones: the HTTP route).
const MAX_READ: u64 = 16 * 1024 * 1024;

fn internal(e: impl std::error::Error + 'static) -> ErrorData {
    ErrorData::internal_error(cellhost::error_chain(&e), None)
}

/// Every regular file of the workspace, newest listing order.
pub(crate) async fn list(ws: &Workspace) -> Result<ListResourcesResult, ErrorData> {
    let listing = ws.list("", true, MAX_LISTED).await.map_err(internal)?;
    let resources = listing
        .entries
        .into_iter()
        .filter(|e| e.kind == EntryType::File)
        .map(|e| {
            let mut r = Resource::new(format!("{PREFIX}{}", e.path), e.name);
            r.mime_type = Some(cellhost::files::mime_of(&e.path).to_owned());
            r.size = Some(e.size);
            r.description = Some(format!("{} in the session's workspace", e.path));
            r
        })
        .collect();
    Ok(ListResourcesResult::with_all_items(resources))
}

/// One file: text when its type is text and it is UTF-8, else a blob.
pub(crate) async fn read(ws: &Workspace, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let Some(path) = uri.strip_prefix(PREFIX) else {
        return Err(ErrorData::resource_not_found(
            format!("{uri:?} is not a cellhost workspace URI (they start with {PREFIX})"),
            None,
        ));
    };
    let not_found = |e: cellhost::files::FileError| match e.code() {
        "io" => internal(e),
        _ => ErrorData::resource_not_found(cellhost::error_chain(&e), None),
    };
    let file = match ws.open(path).await.map_err(not_found)? {
        Opened::File(f) => f,
        Opened::Dir => {
            return Err(ErrorData::resource_not_found(
                format!("{path:?} is a directory; list resources to see its files"),
                None,
            ))
        }
    };
    if file.size > MAX_READ {
        return Err(ErrorData::invalid_params(
            format!(
                "{path:?} has {} bytes, more than a resource carries ({MAX_READ}); download it with GET /v1/sessions/SESSION/files/{path}",
                file.size
            ),
            None,
        ));
    }
    let mut bytes = Vec::new();
    ws.read_to(path, None, &mut bytes)
        .await
        .map_err(not_found)?;
    let mime = cellhost::files::mime_of(path);
    let textual =
        mime.starts_with("text/") || mime == "application/json" || mime == "application/xml";
    let contents = match String::from_utf8(bytes) {
        Ok(text) if textual => ResourceContents::TextResourceContents {
            uri: uri.to_owned(),
            mime_type: Some(mime.to_owned()),
            text,
            meta: None,
        },
        Ok(text) => blob(uri, mime, text.as_bytes()),
        Err(e) => blob(uri, mime, e.as_bytes()),
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

fn blob(uri: &str, mime: &str, bytes: &[u8]) -> ResourceContents {
    ResourceContents::BlobResourceContents {
        uri: uri.to_owned(),
        mime_type: Some(mime.to_owned()),
        blob: base64::engine::general_purpose::STANDARD.encode(bytes),
        meta: None,
    }
}
