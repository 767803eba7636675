//! `cellhost cp|ls|rm`: a session's workspace files from the terminal,
//! through the daemon's `/v1/sessions/{session}/files` routes.
//!
//! `SESSION:PATH` names a file in a session's workspace (like scp: a
//! local path with a `:` in it is written `./a:b`). Uploads stream from
//! disk; downloads stream to a temporary file renamed into place.

use std::path::{Path, PathBuf};

use futures_util::TryStreamExt;
use http_body_util::BodyExt;
use hyper::Method;
use tokio::io::AsyncWriteExt;

use crate::http::{segment, Failure, Server};
use crate::ClientArgs;

fn connect(c: &ClientArgs) -> Result<Server, Failure> {
    Server::new(&c.server, std::env::var("CELLHOST_TOKEN").ok())
}

fn fail(exit: u8, line: impl Into<String>) -> Failure {
    Failure {
        line: line.into(),
        exit,
    }
}

fn report(r: Result<u8, Failure>) -> u8 {
    r.unwrap_or_else(|f| {
        eprintln!("cellhost: {}", f.line);
        f.exit
    })
}

/// `SESSION:PATH` → (session, path); `None` for a local path.
fn remote(arg: &str) -> Option<(&str, &str)> {
    let (session, path) = arg.split_once(':')?;
    if session.is_empty() || session.contains('/') {
        return None;
    }
    Some((session, path))
}

/// The route of `path` in `session`'s workspace, each part encoded.
fn route(session: &str, path: &str) -> String {
    let parts: Vec<String> = path.split('/').map(segment).collect();
    format!(
        "/v1/sessions/{}/files/{}",
        segment(session),
        parts.join("/")
    )
}

/// `cellhost cp SRC DST`: one side local, the other `SESSION:PATH`.
pub(crate) async fn cp(client: ClientArgs, src: String, dst: String) -> u8 {
    report(cp_inner(&client, &src, &dst).await)
}

async fn cp_inner(client: &ClientArgs, src: &str, dst: &str) -> Result<u8, Failure> {
    match (remote(src), remote(dst)) {
        (None, Some((session, path))) => upload(&connect(client)?, Path::new(src), session, path).await,
        (Some((session, path)), None) => {
            download(&connect(client)?, session, path, Path::new(dst)).await
        }
        (Some(_), Some(_)) => Err(fail(
            2,
            "both sides name a session; copy to a local file first (cellhost cp s1:f ./f)",
        )),
        (None, None) => Err(fail(
            2,
            "neither side names a session; write one as SESSION:PATH (e.g. cellhost cp ./sales.csv s1:data/sales.csv)",
        )),
    }
}

async fn upload(server: &Server, src: &Path, session: &str, path: &str) -> Result<u8, Failure> {
    let file = tokio::fs::File::open(src)
        .await
        .map_err(|e| fail(2, format!("cannot read {}: {e}", src.display())))?;
    let meta = file
        .metadata()
        .await
        .map_err(|e| fail(2, format!("cannot read {}: {e}", src.display())))?;
    if !meta.is_file() {
        return Err(fail(2, format!("{} is not a regular file", src.display())));
    }
    // `s1:` or `s1:dir/` keeps the local name.
    let mut path = path.to_owned();
    if path.is_empty() || path.ends_with('/') {
        let name = src.file_name().map(|n| n.to_string_lossy().into_owned());
        path.push_str(&name.unwrap_or_default());
    }
    let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024)
        .map_ok(hyper::body::Frame::data);
    let body = http_body_util::StreamBody::new(stream).boxed();
    let resp = server
        .send_body(
            Method::PUT,
            &route(session, &path),
            body,
            Some("application/octet-stream"),
            "application/json",
            Some(meta.len()),
        )
        .await?;
    let bytes = crate::http::read_all(resp).await?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    println!(
        "{} -> {session}:{} ({} bytes, sha256 {})",
        src.display(),
        v["path"].as_str().unwrap_or(&path),
        v["size"],
        v["sha256"].as_str().unwrap_or("?")
    );
    Ok(0)
}

async fn download(server: &Server, session: &str, path: &str, dst: &Path) -> Result<u8, Failure> {
    let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    if name.is_empty() {
        return Err(fail(2, "name a file to copy, e.g. s1:chart.png"));
    }
    let target: PathBuf = if dst.is_dir() {
        dst.join(name)
    } else {
        dst.to_path_buf()
    };
    let resp = server
        .send(Method::GET, &route(session, path), None, "*/*")
        .await?;
    let listing = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"))
        && !path.ends_with(".json");
    if listing {
        return Err(fail(
            2,
            format!("{session}:{path} is a directory; copy its files one by one (cellhost ls {session} {path})"),
        ));
    }
    let dir = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{name}.cellhost-part"));
    let mut out = tokio::fs::File::create(&tmp)
        .await
        .map_err(|e| fail(1, format!("cannot write {}: {e}", tmp.display())))?;
    let mut body = resp.into_body();
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(1, format!("the download broke off: {e}")))?;
        if let Ok(data) = frame.into_data() {
            total += data.len() as u64;
            out.write_all(&data)
                .await
                .map_err(|e| fail(1, format!("cannot write {}: {e}", tmp.display())))?;
        }
    }
    out.flush()
        .await
        .map_err(|e| fail(1, format!("cannot write {}: {e}", tmp.display())))?;
    drop(out);
    tokio::fs::rename(&tmp, &target)
        .await
        .map_err(|e| fail(1, format!("cannot write {}: {e}", target.display())))?;
    println!("{session}:{path} -> {} ({total} bytes)", target.display());
    Ok(0)
}

/// `cellhost ls SESSION [DIR]`.
pub(crate) async fn ls(
    client: ClientArgs,
    session: String,
    dir: Option<String>,
    recursive: bool,
    json: bool,
) -> u8 {
    report(
        ls_inner(
            &client,
            &session,
            dir.as_deref().unwrap_or(""),
            recursive,
            json,
        )
        .await,
    )
}

async fn ls_inner(
    client: &ClientArgs,
    session: &str,
    dir: &str,
    recursive: bool,
    json: bool,
) -> Result<u8, Failure> {
    let server = connect(client)?;
    let dir = dir.trim_matches('/');
    let mut path = if dir.is_empty() {
        format!("/v1/sessions/{}/files", segment(session))
    } else {
        format!("{}/", route(session, dir))
    };
    if recursive {
        path.push_str("?recursive=true");
    }
    let v: serde_json::Value = server.json(Method::GET, &path, None).await?;
    if json {
        println!("{v}");
        return Ok(0);
    }
    for e in v["entries"].as_array().into_iter().flatten() {
        let kind = e["type"].as_str().unwrap_or("?");
        let mut name = e["path"].as_str().unwrap_or("").to_owned();
        if kind == "dir" {
            name.push('/');
        }
        println!("{:<7} {:>12}  {name}", kind, e["size"]);
    }
    if v["truncated"] == true {
        println!("(listing truncated; list a subdirectory)");
    }
    Ok(0)
}

/// `cellhost rm SESSION:PATH`.
pub(crate) async fn rm(client: ClientArgs, target: String, recursive: bool) -> u8 {
    report(rm_inner(&client, &target, recursive).await)
}

async fn rm_inner(client: &ClientArgs, target: &str, recursive: bool) -> Result<u8, Failure> {
    let Some((session, path)) = remote(target) else {
        return Err(fail(
            2,
            format!("{target:?} names no session; write SESSION:PATH (e.g. s1:data/old.csv)"),
        ));
    };
    let server = connect(client)?;
    let mut route = route(session, path);
    if recursive {
        route.push_str("?recursive=true");
    }
    let _: serde_json::Value = server.json(Method::DELETE, &route, None).await?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_paths_are_told_from_local_ones() {
        assert_eq!(remote("s1:data/x.csv"), Some(("s1", "data/x.csv")));
        assert_eq!(remote("s1:"), Some(("s1", "")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("sales.csv"), None);
        assert_eq!(route("s 1", "a b/c"), "/v1/sessions/s%201/files/a%20b/c");
    }
}
