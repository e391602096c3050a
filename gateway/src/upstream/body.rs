//! List and GET bodies from the remote, read into one buffer as they arrive.
//!
//! kube-rs reads a response body whole before it decodes it (`collect()`, then `to_bytes()`):
//! hyper's chunks first, then one contiguous copy of them, so a list body is resident about
//! two and a half times at its peak (heaptrack of a one-body cold start: 36.7 MB of chunks and
//! a 24.2 MB copy for a 24 MB list). [`Contiguous`] reads every response that is not a watch
//! into one growing buffer as its chunks arrive, each chunk freed once copied, and hands
//! kube-rs that buffer as a single chunk, which `to_bytes` takes without copying. Capacity
//! not yet written is not resident. Watches (`watch=true` or `watch=1`) and a follower's stream
//! of its holder's view ([`crate::kubeapi::replica`]) stream through as they are: their frames
//! are decoded as they come.

use std::pin::pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Either, Full};
use hyper::{Request, Response, Uri};
use tower::{BoxError, Layer, Service};

/// The most a response's `Content-Length` reserves up front; a larger body grows the buffer as
/// it arrives (a remote's word on a length is no reason to reserve gigabytes).
const MAX_RESERVE: usize = 64 << 20;

/// The layer of [`Contiguous`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ContiguousLayer;

impl<S> Layer<S> for ContiguousLayer {
    type Service = Contiguous<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Contiguous(inner)
    }
}

/// Reads the body of every response that is not a watch into one buffer (module docs).
#[derive(Clone, Debug)]
pub struct Contiguous<S>(S);

impl<S, ReqBody, B> Service<Request<ReqBody>> for Contiguous<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Either<Full<Bytes>, B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let stream = streams(req.uri());
        let response = self.0.call(req);
        Box::pin(async move {
            let response = response.await.map_err(Into::into)?;
            if stream {
                return Ok(response.map(Either::Right));
            }
            let (parts, body) = response.into_parts();
            let reserve = parts
                .headers
                .get(hyper::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                .unwrap_or_default()
                .min(MAX_RESERVE);
            let mut buf = Vec::with_capacity(reserve);
            let mut body = pin!(body);
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.map_err(Into::into)?.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            Ok(Response::from_parts(
                parts,
                Either::Left(Full::new(Bytes::from(buf))),
            ))
        })
    }
}

/// True when `uri` asks for a stream: a watch, or a holder's view.
fn streams(uri: &Uri) -> bool {
    uri.path().ends_with(crate::kubeapi::replica::PATH)
        || uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| matches!(kv, "watch=true" | "watch=1"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    use tower::ServiceExt;

    type Chunked = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, BoxError>>>>;

    /// A remote answering every request with `chunks`, one frame each.
    fn remote(
        chunks: &'static [&'static str],
    ) -> impl Service<
        Request<()>,
        Response = Response<Chunked>,
        Error = BoxError,
        Future = std::future::Ready<Result<Response<Chunked>, BoxError>>,
    > + Clone {
        tower::service_fn(move |_req: Request<()>| {
            let frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
                .iter()
                .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
                .collect();
            std::future::ready(Ok(Response::new(StreamBody::new(stream::iter(frames)))))
        })
    }

    async fn frames_of(path: &str) -> Vec<Bytes> {
        let svc = ContiguousLayer.layer(remote(&["{\"items\":", "[1,2", ",3]}"]));
        let resp = svc
            .oneshot(Request::get(path).body(()).expect("request"))
            .await
            .expect("response");
        let mut body = pin!(resp.into_body());
        let mut out = Vec::new();
        while let Some(f) = body.frame().await {
            out.extend(f.expect("frame").into_data().ok());
        }
        out
    }

    #[tokio::test]
    async fn a_list_arrives_as_one_chunk_and_a_watch_as_it_streams() {
        assert_eq!(
            frames_of("/api/v1/pods?limit=500").await,
            [Bytes::from_static(b"{\"items\":[1,2,3]}")],
            "one buffer, the body whole"
        );
        assert_eq!(
            frames_of("/api/v1/pods?watch=true&resourceVersion=7")
                .await
                .len(),
            3,
            "a watch's frames pass one by one"
        );
        assert_eq!(
            frames_of("/links/east/floodgate/v1/view?resourceVersion=7")
                .await
                .len(),
            3,
            "a holder's view passes frame by frame"
        );
        assert_eq!(frames_of("/api/v1/pods?watch=1").await.len(), 3);
        assert_eq!(
            frames_of("/api/v1/pods?watch=false").await.len(),
            1,
            "watch=false is no watch"
        );
    }
}
