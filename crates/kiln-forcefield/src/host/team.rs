//! Threads of a [`super::HostPotential`]'s own for the parts of a structure after the first,
//! which the calling thread runs itself, and the barrier at which the parts wait for each other.
//!
//! The parts wait for each other by spinning, so they must all run at once: rayon's tasks may
//! not (a pool busy with other spinning parts would never start the queued ones), and a thread
//! spawned per call costs 0.2 ms on a VM, as much as a small molecule's whole step. These threads
//! live as long as the potential, and between jobs poll for the next one for [`POLL_FOR`] before
//! they sleep, so a trajectory's steps find them awake, also when the steps are driven from
//! Python (ASE's step between two calls takes ~0.2 ms).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// A part's work, run on a helper thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// How long a helper polls for its next job before sleeping until one comes. Waking a sleeping
/// thread costs tens of microseconds on a VM, and a part that starts late holds up the others at
/// the first barrier; a helper that polled ~30 µs (4096 polls) slept between the steps of ASE's
/// molecular dynamics: benzene's 1 000 steps took 0.94–0.99 s that way and take 0.83–0.87 s.
const POLL_FOR: Duration = Duration::from_millis(1);

/// The helper threads, started when first needed.
#[derive(Default)]
pub(super) struct Team {
    helpers: Mutex<Vec<Sender<Job>>>,
}

impl Team {
    /// Runs `job` on helper `index` (started now if it is not yet running).
    pub(super) fn run(&self, index: usize, mut job: Job) {
        let mut helpers = self.helpers.lock().unwrap_or_else(|e| e.into_inner());
        while helpers.len() <= index {
            let helper = start(helpers.len());
            helpers.push(helper);
        }
        // A helper only stops when its channel closes, so this never repeats; if it did, a
        // fresh helper takes the job.
        while let Err(mpsc::SendError(returned)) = helpers[index].send(job) {
            helpers[index] = start(index);
            job = returned;
        }
    }
}

/// Helper `index`'s thread, and the channel that feeds it.
fn start(index: usize) -> Sender<Job> {
    let (sender, jobs) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("kiln-forcefield part {}", index + 2))
        .spawn(move || serve(jobs))
        .expect("a helper thread for the force kernel");
    sender
}

/// A helper's loop: each job as it comes (a panic ends the job, not the thread: the job's own
/// caller sees it as a missing result), until the team is dropped.
fn serve(jobs: Receiver<Job>) {
    loop {
        let idle = Instant::now();
        let mut next = jobs.try_recv();
        while matches!(next, Err(TryRecvError::Empty)) && idle.elapsed() < POLL_FOR {
            std::hint::spin_loop();
            next = jobs.try_recv();
        }
        let job = match next {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
        };
        let _ = catch_unwind(AssertUnwindSafe(job));
    }
}

/// A barrier whose waiters spin (yielding after a while, for oversubscribed machines) rather than
/// sleep. A part that panics breaks it, and the others panic rather than wait forever.
pub(super) struct SpinBarrier {
    parties: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    broken: AtomicBool,
}

impl SpinBarrier {
    pub(super) fn new(parties: usize) -> Self {
        SpinBarrier {
            parties,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }

    /// Returns once all parties have called it (as often as this caller has).
    pub(super) fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            assert!(
                !self.broken.load(Ordering::Relaxed),
                "another part of the structure panicked"
            );
            if spins < 1 << 11 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Breaks the barrier if the thread holding it unwinds.
    pub(super) fn guard(&self) -> BarrierGuard<'_> {
        BarrierGuard(self)
    }
}

/// Breaks its barrier when dropped during a panic.
pub(super) struct BarrierGuard<'a>(&'a SpinBarrier);

impl Drop for BarrierGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.broken.store(true, Ordering::Relaxed);
        }
    }
}
