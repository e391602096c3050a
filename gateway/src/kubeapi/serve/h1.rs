//! HTTP/1.1 GETs answered without hyper's per-connection buffers.
//!
//! kube-rs opens one HTTP/1.1 connection per watch, and hyper's HTTP/1 connection keeps an
//! 8 KiB write buffer and a read buffer of at least 8 KiB for as long as it is open: more than
//! half of what an idle watcher cost (docs/figures.md). Here each request head is read into a
//! buffer that lives only while the head arrives and is parsed with `httparse`, the request goes
//! to the same router (auth, routing and limits unchanged), and the response is written frame by
//! frame straight to the socket: one write per watch event, nothing held between them. An idle
//! watch holds its socket, its TLS state and its watch stream.
//!
//! Only the plain case is answered here: GET over HTTP/1.1 with no body, no `Upgrade` and no
//! `Expect`, a head within [`MAX_HEADER_BYTES`] and [`MAX_HEADERS`]. Anything else (another
//! method, a body, HTTP/1.0, a head that does not parse or is too large) goes to hyper with the
//! bytes read so far, and hyper serves the connection from then on, so its answers (400, 414,
//! 431) and its handling of bodies are the ones clients already know.
//!
//! What hyper did and this keeps: the header read timeout (from the first wait for a head, idle
//! keep-alive connections too), keep-alive unless either side says `Connection: close`, the
//! `Date` header, `Content-Length` when the body's size is known and chunked framing when it is
//! not, closing the connection when a body fails midway (the client sees a truncated response),
//! noticing that the client went away while its watch waits (the watch is dropped), and, at a
//! graceful shutdown, closing once the response in flight ends.

use std::fmt::Write as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, Version, header};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
use tower::ServiceExt;

use super::{BoxError, Handoff, MAX_HEADER_BYTES, MAX_HEADERS, ServeLimits, hyper_serves};

/// A data frame up to this size is written with its chunk's framing in one write (one TLS
/// record, one syscall: a watch event); a larger one (a page of a list) is written as it is,
/// between its framing, rather than copied.
const COPY_FRAME_BYTES: usize = 16 * 1024;

/// Serves an HTTP/1 connection's requests until it ends, `closing` turns true (after the
/// response in flight), or a request is one for hyper: then hyper serves the rest of the
/// connection as `handoff` says, under the graceful shutdown's `watcher`.
pub(super) async fn serve<IO>(
    mut io: IO,
    router: Router,
    limits: ServeLimits,
    mut closing: watch::Receiver<bool>,
    watcher: Watcher,
    handoff: Handoff,
) -> Result<(), BoxError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut pending = Vec::new();
    loop {
        // What each request's states hold is boxed, made in a block and awaited after it: the
        // connection's future holds only the state it is in (a watch waiting), not the largest.
        let reading = Box::pin(next_head(&mut io, &mut pending, &limits, &mut closing));
        let (call, close) = match reading.await? {
            Head::Closed => return Ok(()),
            Head::Get(req, len) => {
                // Bytes past the head are the next request's (pipelined); an empty buffer is
                // freed, so a connection waiting for its next request holds none.
                pending.drain(..len);
                if pending.is_empty() {
                    pending = Vec::new();
                }
                let close = says_close(req.headers());
                (Box::pin(router.clone().oneshot(*req)), close)
            }
            Head::Other => {
                let io = Rewind {
                    prefix: Bytes::from(pending),
                    io,
                };
                let hyper = Box::pin(hyper_serves(io, router, limits, watcher, handoff));
                return hyper.await;
            }
        };
        let Ok(resp) = call.await;
        let responding = Box::pin(respond(&mut io, resp, close, &mut pending));
        let keep = responding.await?;
        if !keep || *closing.borrow() {
            let _ = io.shutdown().await;
            return Ok(());
        }
    }
}

/// The next request head within the header read timeout; `Closed` when the client closes, the
/// timeout passes or `closing` turns true first.
async fn next_head<IO: AsyncRead + Unpin>(
    io: &mut IO,
    pending: &mut Vec<u8>,
    limits: &ServeLimits,
    closing: &mut watch::Receiver<bool>,
) -> io::Result<Head> {
    let read = tokio::time::timeout(limits.header_read_timeout, read_head(io, pending));
    tokio::select! {
        biased;
        _ = closing.wait_for(|c| *c) => Ok(Head::Closed),
        head = read => head.unwrap_or_else(|_| {
            tracing::debug!("no request head within the header read timeout");
            Ok(Head::Closed)
        }),
    }
}

/// What the next request head came to.
enum Head {
    /// A GET answered here, and the length of its head.
    Get(Box<Request<Body>>, usize),
    /// Anything else: hyper's to answer.
    Other,
    /// The client closed the connection.
    Closed,
}

/// Reads until `pending` holds a whole head, or one for hyper.
async fn read_head<IO: AsyncRead + Unpin>(io: &mut IO, pending: &mut Vec<u8>) -> io::Result<Head> {
    loop {
        if !pending.is_empty() {
            match parse(pending) {
                Some(head) => return Ok(head),
                // Too large for a head: hyper answers 431 (or 414).
                None if pending.len() >= MAX_HEADER_BYTES => return Ok(Head::Other),
                None => {}
            }
        }
        // A little at first, so a connection waiting for its next request holds 64 bytes; a
        // client-go head is a few hundred.
        pending.reserve(if pending.is_empty() { 64 } else { 4096 });
        if io.read_buf(pending).await? == 0 {
            return Ok(Head::Closed);
        }
    }
}

/// Parses a request head from `buf`; `None` while it is not whole.
fn parse(buf: &[u8]) -> Option<Head> {
    // On the stack (parse is not async, so this is no part of the connection's future).
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(Head::Other),
    };
    if req.method != Some("GET") || req.version != Some(1) {
        return Some(Head::Other);
    }
    let mut b = Request::builder()
        .method(Method::GET)
        .version(Version::HTTP_11)
        .uri(req.path.unwrap_or_default());
    for h in req.headers.iter() {
        let name = h.name;
        let bodiless = !name.eq_ignore_ascii_case("content-length") || h.value == b"0";
        let plain = !["transfer-encoding", "upgrade", "expect"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n));
        if !(bodiless && plain) {
            return Some(Head::Other);
        }
        b = b.header(name, h.value);
    }
    // A URI or header the http crate refuses: hyper answers it (414 for a URI too long).
    Some(match b.body(Body::empty()) {
        Ok(req) => Head::Get(Box::new(req), len),
        Err(_) => Head::Other,
    })
}

/// Whether a `Connection` header asks to close after this exchange.
fn says_close(headers: &axum::http::HeaderMap) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

/// A response's head as written, and how its body is framed.
struct ResponseHead {
    bytes: BytesMut,
    /// No body at all (1xx, 204, 304).
    bodiless: bool,
    /// The body in chunks (its size is not known).
    chunked: bool,
    /// The connection closes after it.
    close: bool,
}

/// Writes the head of a response from its `parts` (consumed: a watch holds no headers while it
/// waits), the body's `length` if known, and whether the request said `close`.
fn head_of(parts: axum::http::response::Parts, length: Option<u64>, close: bool) -> ResponseHead {
    let status = parts.status;
    let headers = parts.headers;
    let close = close || says_close(&headers);
    let bodiless = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let has_length = headers.contains_key(header::CONTENT_LENGTH);
    let chunked = !bodiless && !has_length && length.is_none();
    let mut head = BytesMut::with_capacity(512);
    head.put_slice(b"HTTP/1.1 ");
    head.put_slice(status.as_str().as_bytes());
    head.put_u8(b' ');
    head.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.put_slice(b"\r\n");
    for (name, value) in &headers {
        if name != header::TRANSFER_ENCODING && name != header::CONNECTION {
            put_header(&mut head, name.as_str(), value.as_bytes());
        }
    }
    if !headers.contains_key(header::DATE) {
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        put_header(&mut head, "date", date.as_bytes());
    }
    if let (false, false, Some(n)) = (bodiless, has_length, length) {
        put_header(&mut head, "content-length", n.to_string().as_bytes());
    }
    if chunked {
        head.put_slice(b"transfer-encoding: chunked\r\n");
    }
    if close {
        head.put_slice(b"connection: close\r\n");
    }
    head.put_slice(b"\r\n");
    ResponseHead {
        bytes: head,
        bodiless,
        chunked,
        close,
    }
}

/// Writes `resp`; whether the connection may serve another request. A client that closes while
/// the body waits ends it (`Ok(false)`); bytes it sends meanwhile are kept in `pending`.
async fn respond<IO: AsyncRead + AsyncWrite + Unpin>(
    io: &mut IO,
    resp: Response<Body>,
    close: bool,
    pending: &mut Vec<u8>,
) -> io::Result<bool> {
    let (parts, mut body) = resp.into_parts();
    let ResponseHead {
        bytes,
        bodiless,
        chunked,
        close,
    } = head_of(parts, body.size_hint().exact(), close);
    io.write_all(&bytes).await?;
    io.flush().await?;
    drop(bytes);
    if bodiless {
        return Ok(!close);
    }

    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            gone = client_gone(io, pending) => {
                if gone {
                    return Ok(false);
                }
                continue;
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => return Err(io::Error::other(e)),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                // Trailers (none are sent) and empty frames.
                _ => continue,
            },
        };
        write_frame(io, data, chunked).await?;
    }
    if chunked {
        io.write_all(b"0\r\n\r\n").await?;
        io.flush().await?;
    }
    Ok(!close)
}

fn put_header(head: &mut BytesMut, name: &str, value: &[u8]) {
    head.put_slice(name.as_bytes());
    head.put_slice(b": ");
    head.put_slice(value);
    head.put_slice(b"\r\n");
}

/// Writes one data frame, in a chunk when `chunked`, and flushes it.
async fn write_frame<IO: AsyncWrite + Unpin>(
    io: &mut IO,
    data: Bytes,
    chunked: bool,
) -> io::Result<()> {
    if !chunked {
        io.write_all(&data).await?;
        return io.flush().await;
    }
    // The chunk's size line: at most 16 hex digits and CRLF.
    let mut out = BytesMut::with_capacity(
        18 + if data.len() <= COPY_FRAME_BYTES {
            data.len() + 2
        } else {
            0
        },
    );
    write!(out, "{:x}\r\n", data.len()).map_err(io::Error::other)?;
    if data.len() <= COPY_FRAME_BYTES {
        out.put_slice(&data);
        out.put_slice(b"\r\n");
        io.write_all(&out).await?;
    } else {
        io.write_all(&out).await?;
        io.write_all(&data).await?;
        io.write_all(b"\r\n").await?;
    }
    io.flush().await
}

/// Waits for the client while a response waits for its body: `true` once it has closed (or
/// its socket failed), `false` when it sent a byte (kept in `pending`, at most a head's worth;
/// past that the client is no longer read until the response ends).
async fn client_gone<IO: AsyncRead + Unpin>(io: &mut IO, pending: &mut Vec<u8>) -> bool {
    if pending.len() >= MAX_HEADER_BYTES {
        return std::future::pending().await;
    }
    let mut byte = [0u8; 1];
    match io.read(&mut byte).await {
        Ok(0) | Err(_) => true,
        Ok(_) => {
            pending.push(byte[0]);
            false
        }
    }
}

/// An IO that first reads back `prefix` (the bytes read before hyper took the connection).
struct Rewind<IO> {
    prefix: Bytes,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewind<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewind<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
