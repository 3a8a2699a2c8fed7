//! A small HTTP/1.1 server on loopback for tests: routes requests to a handler and records them,
//! so a test can count what a client downloaded.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A request as the handler sees it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub query: String,
    pub headers: BTreeMap<String, String>,
}

/// A response from the handler.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
        }
    }

    pub fn not_found() -> Self {
        Response {
            status: 404,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: b"not found\n".to_vec(),
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// With `password`, the 401 (and Basic challenge of `realm`) of a request without the basic
/// credentials `ci:PASSWORD`; None when it may pass.
pub fn unauthorized(
    request: &Request,
    password: Option<&str>,
    realm: &str,
    body: &[u8],
) -> Option<Response> {
    use base64::Engine;
    let password = password?;
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("ci:{password}"))
    );
    (request.headers.get("authorization") != Some(&expected)).then(|| Response {
        status: 401,
        headers: vec![(
            "WWW-Authenticate".into(),
            format!("Basic realm=\"{realm}\""),
        )],
        body: body.to_vec(),
    })
}

/// A chart repository on loopback: serves the files of `dir` (charts and their index.yaml);
/// with `password`, only to requests with the basic credentials `ci:PASSWORD`.
pub fn serve_dir(dir: &std::path::Path, password: Option<&'static str>) -> Server {
    let dir = dir.to_path_buf();
    Server::start(move |request: &Request| {
        if let Some(refused) = unauthorized(request, password, "charts", b"unauthorized\n") {
            return refused;
        }
        let name = request.path.trim_start_matches('/');
        if name.contains("..") {
            return Response::not_found();
        }
        match std::fs::read(dir.join(name)) {
            Ok(body) => Response::ok("application/octet-stream", body),
            Err(_) => Response::not_found(),
        }
    })
}

type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A running server; it stops when dropped.
pub struct Server {
    pub port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    stopped: Arc<AtomicBool>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("local address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        {
            let requests = requests.clone();
            let stopped = stopped.clone();
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let handler = handler.clone();
                    let requests = requests.clone();
                    thread::spawn(move || serve(stream, &*handler, &requests));
                }
            });
        }
        Server {
            port,
            requests,
            stopped,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// How many requests had this method and a path ending in `suffix`.
    pub fn count(&self, method: &str, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.ends_with(suffix))
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Answers one request on the connection, then closes it.
fn serve(stream: TcpStream, handler: &Handler, requests: &Mutex<Vec<Request>>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            return;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    if length > 0 && reader.read_exact(&mut body).is_err() {
        return;
    }
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path.to_string(), query.to_string()),
        None => (target.clone(), String::new()),
    };
    let request = Request {
        method: method.clone(),
        path,
        query,
        headers,
    };
    if let Ok(mut all) = requests.lock() {
        all.push(request.clone());
    }
    let response = handler(&request);
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        response.status,
        reason(response.status),
        response.body.len()
    );
    for (name, value) in &response.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = writer.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = writer.write_all(&response.body);
    }
    let _ = writer.flush();
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        500 => "Internal Server Error",
        404 => "Not Found",
        _ => "Status",
    }
}
