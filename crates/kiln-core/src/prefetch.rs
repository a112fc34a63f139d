//! Batches prepared ahead on background threads: one pass over an order of items, cut into
//! chunks of `batch_size`, each chunk turned into a host batch by `make` on one of `workers`
//! threads (thread `w` makes chunks `w, w + workers, …`), each at most `prefetch` chunks ahead of
//! the consumer, handed back in order. kiln-cache's streamed image feeds read their shards
//! through it; any other data (structures, token ids) can too (kiln-train's `HostData`).
//!
//! ```
//! use std::sync::Arc;
//! use kiln_core::Prefetch;
//!
//! let order = Arc::new(vec![3, 1, 4, 0, 2]);
//! let sums: Vec<usize> = Prefetch::start(order, 2, 0, 2, 2, |chunk: &[usize]| chunk.iter().sum())
//!     .collect();
//! assert_eq!(sums, [4, 4, 2]);
//! ```

use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// One pass of prefetched host batches; its threads stop when it is dropped.
pub struct Prefetch<T> {
    streams: Vec<Stream<T>>,
    first: usize,
    next: usize,
    count: usize,
}

impl<T: Send + 'static> Prefetch<T> {
    /// The chunks of `order` from chunk `first` on (the ones before are never made), made by
    /// `make` on `workers` threads (at least 1) at most `prefetch` (at least 1) ahead each.
    pub fn start(
        order: Arc<Vec<usize>>,
        batch_size: usize,
        first: usize,
        workers: usize,
        prefetch: usize,
        make: impl Fn(&[usize]) -> T + Send + Sync + 'static,
    ) -> Self {
        let batch_size = batch_size.max(1);
        let count = order.len().div_ceil(batch_size);
        let first = first.min(count);
        let workers = workers.max(1);
        let make = Arc::new(make);
        let streams = (0..workers.min(count - first))
            .map(|worker| {
                let (order, make) = (Arc::clone(&order), Arc::clone(&make));
                Stream::start(
                    first + worker,
                    workers,
                    prefetch.max(1),
                    move |start, step, send| {
                        for chunk in order.chunks(batch_size).skip(start).step_by(step) {
                            if !send(make(chunk)) {
                                return;
                            }
                        }
                    },
                )
            })
            .collect();
        Prefetch {
            streams,
            first,
            next: first,
            count,
        }
    }
}

impl<T> Iterator for Prefetch<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        if self.next == self.count {
            return None;
        }
        let streams = self.streams.len();
        let stream = &mut self.streams[(self.next - self.first) % streams];
        self.next += 1;
        Some(stream.receive())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count - self.next;
        (left, Some(left))
    }
}

impl<T> ExactSizeIterator for Prefetch<T> {}

/// A background thread making chunks `start`, `start + step`, … at most `prefetch` ahead.
struct Stream<T> {
    receiver: Option<Receiver<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> Stream<T> {
    /// Runs `produce(start, step, send)` on a new thread; `send` hands a batch over (waiting
    /// while `prefetch` are ready) and says whether the consumer still listens.
    fn start(
        start: usize,
        step: usize,
        prefetch: usize,
        produce: impl FnOnce(usize, usize, &dyn Fn(T) -> bool) + Send + 'static,
    ) -> Self {
        let (sender, receiver) = sync_channel(prefetch);
        let thread = std::thread::Builder::new()
            .name(format!("kiln-prefetch-{}", start % step))
            .spawn(move || {
                // The consumer hung up (its pass was dropped): the producer stops.
                produce(start, step, &|batch| sender.send(batch).is_ok());
            })
            .expect("the OS starts a thread");
        Stream {
            receiver: Some(receiver),
            thread: Some(thread),
        }
    }
}

impl<T> Stream<T> {
    /// The next batch of this stream; a panic in its thread is resumed here.
    fn receive(&mut self) -> T {
        let receiver = self.receiver.as_ref().expect("receiving until dropped");
        match receiver.recv() {
            Ok(batch) => batch,
            Err(_) => match self.thread.take().map(JoinHandle::join) {
                Some(Err(panic)) => std::panic::resume_unwind(panic),
                _ => unreachable!("a stream ended before its last batch without panicking"),
            },
        }
    }
}

impl<T> Drop for Stream<T> {
    fn drop(&mut self) {
        // Dropping the receiver first unblocks a thread waiting to send.
        self.receiver.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_come_back_in_order_from_any_start_with_any_number_of_workers() {
        let order: Arc<Vec<usize>> = Arc::new((0..23).rev().collect());
        let expected: Vec<Vec<usize>> = order.chunks(4).map(<[usize]>::to_vec).collect();
        for workers in [1, 2, 3, 7] {
            for first in 0..=expected.len() {
                let got: Vec<Vec<usize>> =
                    Prefetch::start(Arc::clone(&order), 4, first, workers, 2, <[usize]>::to_vec)
                        .collect();
                assert_eq!(got, expected[first..], "{workers} workers from {first}");
            }
        }
    }

    #[test]
    fn a_panic_while_making_a_batch_reaches_the_consumer() {
        let order = Arc::new((0..10).collect::<Vec<usize>>());
        let mut pass = Prefetch::start(order, 2, 0, 2, 1, |chunk: &[usize]| {
            assert!(!chunk.contains(&6), "item 6 is unreadable");
            chunk.len()
        });
        assert_eq!(pass.next(), Some(2));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pass.count()));
        assert!(caught.is_err());
    }
}
