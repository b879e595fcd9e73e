//! Which parts of a socket's relay woke its task ([`Wakes`]): each direction, and
//! the socket's ends (the gateway stopping, the idle timer), is polled with a waker
//! of its own, which marks its part before it wakes the task. A turn of the relay
//! then polls only the parts marked: a message one way wakes one direction, and the
//! other direction's reader, the stop signal and the timer are not asked again (each
//! still holds the waker it was last polled with).
//!
//! It does not poll anything itself, and knows nothing of what the parts are.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Wake, Waker};

use parking_lot::Mutex;

/// A part of the relay, polled with a waker of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// The client to upstream direction.
    Up = 0,
    /// The upstream to client direction.
    Down = 1,
    /// The stop signal and the idle timer.
    Ends = 2,
}

/// The marks of the parts woken since the relay's last turn, and the wakers that set
/// them.
pub(super) struct Wakes {
    shared: Arc<Shared>,
    /// One a part, in [`Part`]'s order.
    wakers: [Waker; 3],
}

/// What the parts' wakers share.
struct Shared {
    /// A bit a part woken since the last turn.
    marks: AtomicU8,
    /// The waker of the task running the relay, as of its last turn.
    task: Mutex<Option<Waker>>,
}

/// A part's waker: it marks the part, then wakes the relay's task.
struct PartWaker {
    shared: Arc<Shared>,
    bit: u8,
}

impl Wake for PartWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.marks.fetch_or(self.bit, Ordering::AcqRel);
        if let Some(task) = &*self.shared.task.lock() {
            task.wake_by_ref();
        }
    }
}

/// The parts a turn polls.
#[derive(Debug, Clone, Copy)]
pub(super) struct Woken(u8);

impl Woken {
    /// Whether `part` was woken (or is not polled yet).
    pub(super) fn has(self, part: Part) -> bool {
        self.0 & bit(part) != 0
    }
}

impl Wakes {
    /// Wakers for the three parts, every part marked: the first turn polls them all.
    pub(super) fn new() -> Wakes {
        let shared = Arc::new(Shared {
            marks: AtomicU8::new(bit(Part::Up) | bit(Part::Down) | bit(Part::Ends)),
            task: Mutex::new(None),
        });
        let waker = |part| {
            Waker::from(Arc::new(PartWaker {
                shared: shared.clone(),
                bit: bit(part),
            }))
        };
        Wakes {
            wakers: [waker(Part::Up), waker(Part::Down), waker(Part::Ends)],
            shared,
        }
    }

    /// Starts a turn of the relay, whose task `cx` is polling: the parts woken since
    /// the last turn, their marks cleared (a part woken from now on is marked again,
    /// and its waker wakes the task).
    pub(super) fn turn(&self, cx: &Context<'_>) -> Woken {
        {
            let mut task = self.shared.task.lock();
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        Woken(self.shared.marks.swap(0, Ordering::AcqRel))
    }

    /// The context to poll `part` with.
    pub(super) fn context(&self, part: Part) -> Context<'_> {
        Context::from_waker(&self.wakers[part as usize])
    }
}

/// `part`'s bit in the marks.
fn bit(part: Part) -> u8 {
    1 << part as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A task waker that counts its wakes.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_turn_polls_the_parts_woken_since_the_last_one() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let cx = Context::from_waker(&task);
        let wakes = Wakes::new();
        let first = wakes.turn(&cx);
        assert!(first.has(Part::Up) && first.has(Part::Down) && first.has(Part::Ends));
        let nothing = wakes.turn(&cx);
        assert!(!nothing.has(Part::Up) && !nothing.has(Part::Down) && !nothing.has(Part::Ends));
        wakes.context(Part::Down).waker().wake_by_ref();
        // (By value too: tokio's I/O driver wakes a waker it takes out.)
        let taken = wakes.context(Part::Down).waker().clone();
        taken.wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        let down = wakes.turn(&cx);
        assert!(!down.has(Part::Up) && down.has(Part::Down) && !down.has(Part::Ends));
    }

    #[test]
    fn a_part_woken_before_the_first_turn_wakes_no_task() {
        let wakes = Wakes::new();
        wakes.context(Part::Ends).waker().wake_by_ref();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        assert!(wakes.turn(&Context::from_waker(&task)).has(Part::Ends));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }
}
