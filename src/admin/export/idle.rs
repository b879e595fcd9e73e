//! The thread that writes usage exports' lines at the lowest priority the system
//! has (Linux `SCHED_IDLE`: it runs when a core would otherwise idle), so that an
//! export takes the time the proxy leaves rather than time from the proxy.
//!
//! Only the writing is handed over (naming each caller, formatting its windows as
//! JSON or CSV, the timestamps): the counters are read by the export's own task, as
//! a lock the proxy's workers share must never wait for a thread that gets no core,
//! and Redis reads keep their timeouts. A batch the thread has not started within
//! [`FLOOR`] is written by the export's task itself: on a machine with no idle core
//! an export slows to a batch every [`FLOOR`] or so, it never stops.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

/// How long a batch waits for the idle thread before its own task writes it.
const FLOOR: Duration = Duration::from_millis(20);

/// A batch's writing, taken by whichever starts it first: the thread, or the task
/// once [`FLOOR`] has passed.
type Work = Arc<Mutex<Option<Box<dyn FnOnce() -> String + Send>>>>;

/// A batch handed to the thread, and where its text goes.
type Job = (Work, oneshot::Sender<String>);

/// The thread's queue, started with the first export (`None`: it could not be
/// started, and every batch is written by its task).
static THREAD: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

/// The text `write` makes, written on the idle thread, or by this task if the
/// thread has not started it within [`FLOOR`]. `None` if the thread failed while
/// writing it.
pub(super) async fn run(write: impl FnOnce() -> String + Send + 'static) -> Option<String> {
    let work: Work = Arc::new(Mutex::new(Some(Box::new(write))));
    let (done, mut text) = oneshot::channel();
    let queued = (THREAD.get_or_init(start).as_ref())
        .is_some_and(|jobs| jobs.send((Arc::clone(&work), done)).is_ok());
    if queued && let Ok(written) = tokio::time::timeout(FLOOR, &mut text).await {
        return written.ok();
    }
    match take(&work) {
        Some(write) => Some(write()),
        // The thread started it: wait for it.
        None => text.await.ok(),
    }
}

/// The batch's writing, unless it was taken already.
fn take(work: &Work) -> Option<Box<dyn FnOnce() -> String + Send>> {
    work.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Starts the thread, at idle priority: it writes each batch queued that its task
/// has not taken back.
fn start() -> Option<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let thread = std::thread::Builder::new().name("usage export".to_string());
    let started = thread.spawn(move || {
        lower_priority();
        for (work, done) in queue {
            if let Some(write) = take(&work) {
                let _ = done.send(write());
            }
        }
    });
    started.ok().map(|_| jobs)
}

/// Puts the calling thread at the lowest priority: Linux's `SCHED_IDLE` policy,
/// elsewhere the lowest the platform gives. Failing leaves it as it was.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::unix::{
            NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
            thread_native_id,
        };
        let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
        let _ = set_thread_priority_and_policy(
            thread_native_id(),
            thread_priority::ThreadPriority::Min,
            idle,
        );
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = thread_priority::set_current_thread_priority(thread_priority::ThreadPriority::Min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_batch_is_written_once_in_the_order_asked() {
        let mut texts = Vec::new();
        for n in 0..50 {
            texts.push(run(move || format!("batch {n}\n")).await.unwrap());
        }
        let expected: Vec<String> = (0..50).map(|n| format!("batch {n}\n")).collect();
        assert_eq!(texts, expected);
    }

    #[tokio::test]
    async fn a_batch_the_thread_does_not_start_is_written_by_its_task() {
        // The first batch holds the thread for longer than the floor: the second,
        // queued behind it, is taken back and written here meanwhile.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = tokio::spawn(run(move || {
            let _ = held.recv_timeout(Duration::from_secs(5));
            "first".to_string()
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let writer = std::thread::current().id();
        let second = run(move || format!("{:?}", std::thread::current().id())).await;
        assert_eq!(second.as_deref(), Some(&*format!("{writer:?}")));
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().as_deref(), Some("first"));
    }
}
