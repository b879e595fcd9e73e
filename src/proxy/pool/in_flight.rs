//! An upstream exchange whose client may go away before the response head: then the
//! exchange is finished by a background task on the same worker, which waits for
//! the response until the exchange's deadline, tells the request's [`Orphan`] (if it
//! has one) what came of it, reads the body and gives the connection back to its
//! pool.

use super::*;

/// An exchange waiting for its response head, with the connection it was sent on.
/// Dropped before the head arrived (the client went away), it hands both to a
/// background task that waits for the response until the exchange's deadline (an
/// exchange dropped because the deadline passed, a 504, thus ends at once), tells
/// the orphan, reads what it hands back (or the body itself, without one) and gives
/// the connection back if the body ended in time.
///
/// The exchange is boxed so that it can move to that task: one allocation per
/// request buys not opening a new upstream connection per abandoned one.
pub(super) struct InFlight<'a, E: Broken> {
    exchange: Option<Exchange<E>>,
    conn: Option<Conn>,
    riders: Riders,
    pool: &'a Arc<Pool>,
    deadline: Instant,
}

type Exchange<E> = Pin<Box<dyn Future<Output = Result<Response<Incoming>, E>> + Send>>;

/// The connection an exchange travels on: an HTTP/1.1 connection of its own, which
/// goes back to the pool once the body has been read, or a stream of this thread's
/// HTTP/2 connection, which stays with the pool whatever becomes of the body.
pub(super) enum Conn {
    H1(SendRequest<RequestBody>),
    H2,
}

/// The error an exchange fails with, as hyper's.
pub(super) trait Broken: Send + 'static {
    fn into_error(self) -> hyper::Error;
}

impl Broken for hyper::Error {
    fn into_error(self) -> hyper::Error {
        self
    }
}

impl<T: Send + 'static> Broken for hyper::client::conn::TrySendError<T> {
    fn into_error(self) -> hyper::Error {
        hyper::client::conn::TrySendError::into_error(self)
    }
}

impl<'a, E: Broken> InFlight<'a, E> {
    pub(super) fn new(
        exchange: impl Future<Output = Result<Response<Incoming>, E>> + Send + 'static,
        conn: Conn,
        riders: Riders,
        pool: &'a Arc<Pool>,
        deadline: Instant,
    ) -> InFlight<'a, E> {
        InFlight {
            exchange: Some(Box::pin(exchange)),
            conn: Some(conn),
            riders,
            pool,
            deadline,
        }
    }
}

/// The response with the connection attached to its body; or the exchange's error
/// with the riders, boxed (rare, and the error can hold the whole request).
type Outcome<E> = Result<Response<Body>, Box<(E, Riders)>>;

impl<E: Broken> Future for InFlight<'_, E> {
    type Output = Outcome<E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let exchange = self.exchange.as_mut().expect("polled after completion");
        let result = std::task::ready!(exchange.as_mut().poll(cx));
        self.exchange = None;
        let conn = self
            .conn
            .take()
            .expect("the connection stays until completion");
        let riders = std::mem::take(&mut self.riders);
        Poll::Ready(match result {
            // The client is here for the head: the orphan is not needed.
            Ok(response) => Ok(self.pool.attach_to(response, conn, riders.held)),
            Err(err) => Err(Box::new((err, riders))),
        })
    }
}

impl<E: Broken> Drop for InFlight<'_, E> {
    fn drop(&mut self) {
        let (Some(exchange), Some(conn)) = (self.exchange.take(), self.conn.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, deadline) = (self.pool.clone(), self.deadline);
        let Riders { held, mut orphan } = std::mem::take(&mut self.riders);
        if Instant::now() >= deadline {
            // Dropped for the deadline: the request answers its client (a 504) and
            // settles itself; only the connection is left to see to.
            orphan = None;
        }
        runtime.spawn(async move {
            let answered = match tokio::time::timeout_at(deadline, exchange).await {
                Ok(Ok(response)) => Ok(pool.attach_to(response, conn, held)),
                Ok(Err(err)) => Err(Failure::Exchange(err.into_error())),
                Err(_) => Err(Failure::Deadline),
            };
            let left = match orphan {
                Some(orphan) => orphan(&pool, answered),
                None => answered.ok(),
            };
            if let Some(response) = left {
                let _ = tokio::time::timeout_at(deadline, drain(response)).await;
            }
        });
    }
}

/// Reads the body of a response whose client went away, up to [`DRAIN_AT_MOST`]
/// bytes: a body read to its end gives its connection back to the pool; one dropped
/// before (longer, or still coming at the deadline) closes it, and a watched one is
/// read on for its watch (see [`Body`]).
async fn drain(response: Response<Body>) {
    let mut body = response.into_body();
    let mut read = 0;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let Ok(frame) = frame else {
            return;
        };
        read += frame.data_ref().map_or(0, Bytes::len);
        if read > DRAIN_AT_MOST {
            return;
        }
    }
}

impl Pool {
    /// `response`'s body as sluice sends it, read from `conn`, holding `held`.
    fn attach_to(
        self: &Arc<Pool>,
        response: Response<Incoming>,
        conn: Conn,
        held: Option<Held>,
    ) -> Response<Body> {
        match conn {
            Conn::H1(sender) => self.attach(response, sender, held),
            Conn::H2 => self.attach_h2(response, held),
        }
    }
}
