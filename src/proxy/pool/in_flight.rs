//! An upstream exchange whose client may go away before the response head: then the
//! exchange is finished by a background task on the same worker, which reads the
//! response and gives the connection back to its pool.

use super::*;

/// An exchange waiting for its response head, with the connection it was sent on.
/// Dropped before the head arrived (the client went away), it hands both to a
/// background task that reads the response and gives the connection back, if that
/// is over by the exchange's deadline (an exchange dropped because the deadline
/// passed, a 504, is thus closed at once).
///
/// The exchange is boxed so that it can move to that task: one allocation per
/// request buys not opening a new upstream connection per abandoned one.
pub(super) struct InFlight<'a, E: Send + 'static> {
    exchange: Option<Exchange<E>>,
    sender: Option<SendRequest<RequestBody>>,
    held: Option<Held>,
    pool: &'a Arc<Pool>,
    deadline: Instant,
}

type Exchange<E> = Pin<Box<dyn Future<Output = Result<Response<Incoming>, E>> + Send>>;

impl<'a, E: Send + 'static> InFlight<'a, E> {
    pub(super) fn new(
        exchange: impl Future<Output = Result<Response<Incoming>, E>> + Send + 'static,
        sender: SendRequest<RequestBody>,
        held: Option<Held>,
        pool: &'a Arc<Pool>,
        deadline: Instant,
    ) -> InFlight<'a, E> {
        InFlight {
            exchange: Some(Box::pin(exchange)),
            sender: Some(sender),
            held,
            pool,
            deadline,
        }
    }
}

/// The response with the connection attached to its body; or the exchange's error
/// with the held guard, boxed (rare, and the error can hold the whole request).
type Outcome<E> = Result<Response<crate::http::body::Body>, Box<(E, Option<Held>)>>;

impl<E: Send + 'static> Future for InFlight<'_, E> {
    type Output = Outcome<E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let exchange = self.exchange.as_mut().expect("polled after completion");
        let result = std::task::ready!(exchange.as_mut().poll(cx));
        self.exchange = None;
        let sender = self
            .sender
            .take()
            .expect("the sender stays until completion");
        let held = self.held.take();
        Poll::Ready(match result {
            Ok(response) => Ok(self.pool.attach(response, sender, held)),
            Err(err) => Err(Box::new((err, held))),
        })
    }
}

impl<E: Send + 'static> Drop for InFlight<'_, E> {
    fn drop(&mut self) {
        let (Some(exchange), Some(sender)) = (self.exchange.take(), self.sender.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, deadline, held) = (self.pool.clone(), self.deadline, self.held.take());
        let response = async move { exchange.await.ok() };
        runtime.spawn(async move {
            let _ = tokio::time::timeout_at(deadline, finish(response, sender, pool)).await;
            drop(held);
        });
    }
}

/// Reads the response of an exchange whose client went away, and gives the
/// connection back if the body ended within [`DRAIN_AT_MOST`] bytes.
async fn finish(
    exchange: impl Future<Output = Option<Response<Incoming>>>,
    sender: SendRequest<RequestBody>,
    pool: Arc<Pool>,
) {
    let Some(response) = exchange.await else {
        return;
    };
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
    pool.give_back(sender);
}
