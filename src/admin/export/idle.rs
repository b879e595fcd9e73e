//! The thread that writes usage exports' lines at the lowest priority the system
//! has (Linux `SCHED_IDLE`: it runs when a core would otherwise idle), so that an
//! export takes the time the proxy leaves rather than time from the proxy.
//!
//! Only the writing is handed over (naming each caller, formatting its windows as
//! JSON or CSV, the timestamps): the counters are read by the export's own task, as
//! a lock the proxy's workers share must never wait for a thread that gets no core,
//! and Redis reads keep their timeouts. A batch the thread has not finished within
//! [`FLOOR`] is written by the export's task itself (the thread, if it started it,
//! finishes for nothing): on a machine with no idle core an export slows to a batch
//! every [`FLOOR`] or so, it never stops, even when the thread is preempted halfway
//! through a batch and gets no core again for a long time.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::oneshot;

/// How long a batch waits for the idle thread before its own task writes it.
const FLOOR: Duration = Duration::from_millis(20);

/// A batch's writing: run by the thread, or by its task once [`FLOOR`] has passed
/// (by both, if the thread was late).
type Work = Arc<dyn Fn() -> String + Send + Sync>;

/// A batch handed to the thread, and where its text goes.
type Job = (Work, oneshot::Sender<String>);

/// The thread's queue, started with the first export (`None`: it could not be
/// started, and every batch is written by its task).
static THREAD: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

/// The text `write` makes, written on the idle thread, or by this task if the
/// thread has not finished it within [`FLOOR`].
pub(super) async fn run(write: impl Fn() -> String + Send + Sync + 'static) -> String {
    let work: Work = Arc::new(write);
    let (done, mut text) = oneshot::channel();
    let queued = (THREAD.get_or_init(start).as_ref())
        .is_some_and(|jobs| jobs.send((Arc::clone(&work), done)).is_ok());
    if queued && let Ok(Ok(written)) = tokio::time::timeout(FLOOR, &mut text).await {
        return written;
    }
    // Closed, the channel tells the thread to skip the batch if it has not begun it.
    drop(text);
    work()
}

/// Starts the thread, at idle priority: it writes each batch queued whose task is
/// still waiting for it.
fn start() -> Option<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let thread = std::thread::Builder::new().name(THREAD_NAME.to_string());
    let started = thread.spawn(move || {
        lower_priority();
        for (work, done) in queue {
            if !done.is_closed() {
                let _ = done.send(work());
            }
        }
    });
    started.ok().map(|_| jobs)
}

/// The idle thread's name (as `top -H` and `/proc` show it).
const THREAD_NAME: &str = "usage export";

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
            texts.push(run(move || format!("batch {n}\n")).await);
        }
        let expected: Vec<String> = (0..50).map(|n| format!("batch {n}\n")).collect();
        assert_eq!(texts, expected);
    }

    #[tokio::test]
    async fn a_batch_the_thread_does_not_finish_in_time_is_written_by_its_task() {
        // On the idle thread the batch takes far longer than the floor (as when the
        // thread is preempted halfway): its task writes it meanwhile.
        let here = std::thread::current().name().map(str::to_string);
        let written = run(|| {
            let name = std::thread::current().name().map(str::to_string);
            if name.as_deref() == Some(THREAD_NAME) {
                std::thread::sleep(Duration::from_millis(500));
            }
            format!("{name:?}")
        })
        .await;
        assert_eq!(written, format!("{here:?}"));
    }
}
