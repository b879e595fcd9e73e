//! Sluice's own outbound requests: one GET on a connection of its own, over http or
//! https (verified against the system's roots or a `ca_file`), and its body read up
//! to a bound.
//!
//! For what sluice fetches for itself (a JWKS key set, `sluice health`'s probe of
//! `/readyz`), never for a client's request: those go through the proxy's pools.
//! Timeouts are the caller's, around the whole exchange.

use std::path::Path;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Why a GET got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("{0}")]
    BadUrl(&'static str),
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("TLS: {0}")]
    Tls(std::io::Error),
    #[error("HTTP: {0}")]
    Http(hyper::Error),
    #[error("body: {0}")]
    Body(Box<dyn std::error::Error + Send + Sync>),
}

/// What a GET asks for besides its URL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Get<'a> {
    /// `Accept`, if the answer should be of one type.
    pub accept: Option<&'static str>,
    /// The CA bundle an https server is verified against; the system's roots without.
    pub ca_file: Option<&'a Path>,
}

/// GETs `url` and answers the response head; [`body`] reads the rest.
pub(crate) async fn get(url: &Uri, asked: Get<'_>) -> Result<Response<Incoming>, ClientError> {
    let host = url.host().ok_or(ClientError::BadUrl("no host"))?;
    let host = host.trim_matches(['[', ']']);
    let https = url.scheme_str() == Some("https");
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(ClientError::Connect)?;
    let path = url.path_and_query().map_or("/", |pq| pq.as_str());
    let authority = url.authority().map_or(host, |a| a.as_str());
    let request = Request::get(path);
    let mut request = request
        .body(Empty::<Bytes>::new())
        .map_err(|_| ClientError::BadUrl("not a request target"))?;
    let headers = request.headers_mut();
    let authority =
        HeaderValue::try_from(authority).map_err(|_| ClientError::BadUrl("not a host"))?;
    headers.insert(http::header::HOST, authority);
    if let Some(accept) = asked.accept {
        headers.insert(http::header::ACCEPT, HeaderValue::from_static(accept));
    }
    if !https {
        return exchange(tcp, request).await;
    }
    let connector = crate::tls::upstream::connector(asked.ca_file, &[b"http/1.1"]);
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| ClientError::BadUrl("not a server name"))?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(ClientError::Tls)?;
    exchange(tls, request).await
}

/// The body of `response`; longer than `max_bytes` is an error.
pub(crate) async fn body(
    response: Response<Incoming>,
    max_bytes: usize,
) -> Result<Bytes, ClientError> {
    let limited = Limited::new(response.into_body(), max_bytes);
    let collected = limited.collect().await.map_err(ClientError::Body)?;
    Ok(collected.to_bytes())
}

/// Sends `request` over `io` and answers the response head.
async fn exchange<IO>(
    io: IO,
    request: Request<Empty<Bytes>>,
) -> Result<Response<Incoming>, ClientError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(ClientError::Http)?;
    tokio::spawn(connection);
    sender
        .send_request(request)
        .await
        .map_err(ClientError::Http)
}
