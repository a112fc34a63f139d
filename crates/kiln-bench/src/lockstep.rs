//! Two builds measured in turns, so that the machine's drift cancels in their ratios.
//!
//! On a shared VM two runs of the same code minutes apart differ by 10–50%, and within a run the
//! speed can jump by half for a second at a time: more than the samples of either run can show,
//! so a verdict read from a saved baseline's numbers cries wolf. Here the baseline's saved build
//! and the new build run side by side as two processes that take their samples in turns: for
//! each benchmark, a short block of samples of one, then of the other, in alternating order.
//! Each pair of blocks yields a ratio of medians taken a fraction of a second apart, and the
//! change is read from those ratios (see [`paired_change`](crate::stats::paired_change)).
//!
//! The conversation is lines of text. The run being paced (a [`Lockstep`]) writes
//! `kiln-bench ready NAME` once a benchmark is warm, then answers each `block SECONDS` (samples
//! until that much time is spent, at least one) or `alone` (its own full measurement) with
//! `kiln-bench samples S1 S2 …`, until `done`. Its end of output ends the conversation. Other
//! lines on its output are ignored.

use std::io::{BufRead, Write};

use crate::BenchError;
use crate::baseline::{Comparison, Method, Row, Verdict};
use crate::bench::{Alone, Config, Pacer};
use crate::report::SuiteRun;
use crate::stats::{MIN_PAIRS, paired_change, percentile_sorted};

/// Marks the lines of the conversation on a run's output.
const PREFIX: &str = "kiln-bench ";

/// Turns taken per benchmark by default.
pub const DEFAULT_PAIRS: usize = 20;

/// The paced side: a run whose samples another process (see [`conduct`]) schedules.
pub struct Lockstep<R, W> {
    commands: R,
    replies: W,
}

impl<R: BufRead, W: Write> Lockstep<R, W> {
    /// Reads commands from `commands` and answers on `replies`.
    pub fn new(commands: R, replies: W) -> Self {
        Lockstep { commands, replies }
    }

    fn say(&mut self, line: &str) -> Result<(), BenchError> {
        writeln!(self.replies, "{PREFIX}{line}")
            .and_then(|()| self.replies.flush())
            .map_err(|e| BenchError::Conversation(format!("cannot answer: {e}")))
    }

    fn say_samples(&mut self, samples: &[f64]) -> Result<(), BenchError> {
        let list: Vec<String> = samples.iter().map(f64::to_string).collect();
        self.say(&format!("samples {}", list.join(" ")))
    }
}

impl<R: BufRead, W: Write> Pacer for Lockstep<R, W> {
    fn samples(
        &mut self,
        name: &str,
        config: &Config,
        sample: &mut dyn FnMut() -> Result<f64, BenchError>,
    ) -> Result<Vec<f64>, BenchError> {
        self.say(&format!("ready {name}"))?;
        let mut all = Vec::new();
        loop {
            let mut line = String::new();
            self.commands
                .read_line(&mut line)
                .map_err(|e| BenchError::Conversation(format!("cannot read a command: {e}")))?;
            let command = line.trim();
            let taken = if let Some(seconds) = command.strip_prefix("block ") {
                let seconds: f64 = seconds
                    .parse()
                    .map_err(|_| BenchError::Conversation(format!("bad command `{command}`")))?;
                let mut taken = Vec::new();
                let mut spent = 0.0;
                while taken.is_empty() || spent < seconds {
                    let s = sample()?;
                    spent += s;
                    taken.push(s);
                }
                taken
            } else if command == "alone" {
                Alone.samples(name, config, sample)?
            } else if command == "done" && !all.is_empty() {
                return Ok(all);
            } else {
                return Err(BenchError::Conversation(format!(
                    "unexpected command `{command}` at benchmark `{name}`"
                )));
            };
            self.say_samples(&taken)?;
            all.extend(taken);
        }
    }
}

/// The conductor's end of the conversation with one paced run.
pub struct Paced<R, W> {
    label: &'static str,
    replies: R,
    commands: W,
    pending: Option<Event>,
}

enum Event {
    Ready(String),
    Finished,
}

impl<R: BufRead, W: Write> Paced<R, W> {
    /// A paced run called `label` in messages, answering on `replies` to `commands`.
    pub fn new(label: &'static str, replies: R, commands: W) -> Self {
        Paced {
            label,
            replies,
            commands,
            pending: None,
        }
    }

    /// Waits until the run is ready for its first benchmark (or has ended).
    pub fn wait_until_ready(&mut self) -> Result<(), BenchError> {
        let event = self.next_event()?;
        self.pending = Some(event);
        Ok(())
    }

    fn broken(&self, what: impl std::fmt::Display) -> BenchError {
        BenchError::Conversation(format!("{}: {what}", self.label))
    }

    /// The next line of the conversation, without its prefix; `None` at the end of output.
    fn next_line(&mut self) -> Result<Option<String>, BenchError> {
        loop {
            let mut line = String::new();
            match self.replies.read_line(&mut line) {
                Ok(0) => return Ok(None),
                Ok(_) => {
                    if let Some(said) = line.trim_end().strip_prefix(PREFIX) {
                        return Ok(Some(said.to_string()));
                    }
                }
                Err(e) => return Err(self.broken(format!("cannot read its output: {e}"))),
            }
        }
    }

    fn next_event(&mut self) -> Result<Event, BenchError> {
        if let Some(event) = self.pending.take() {
            return Ok(event);
        }
        match self.next_line()? {
            None => Ok(Event::Finished),
            Some(line) => match line.strip_prefix("ready ") {
                Some(name) => Ok(Event::Ready(name.to_string())),
                None => Err(self.broken(format!("said `{line}` where a benchmark was due"))),
            },
        }
    }

    fn tell(&mut self, command: &str) -> Result<(), BenchError> {
        writeln!(self.commands, "{command}")
            .and_then(|()| self.commands.flush())
            .map_err(|e| self.broken(format!("stopped listening ({e})")))
    }

    fn samples(&mut self, command: &str) -> Result<Vec<f64>, BenchError> {
        self.tell(command)?;
        let line = self
            .next_line()?
            .ok_or_else(|| self.broken("ended in the middle of a benchmark"))?;
        line.strip_prefix("samples ")
            .and_then(|list| list.split(' ').map(|s| s.parse().ok()).collect())
            .ok_or_else(|| self.broken(format!("said `{line}` where samples were due")))
    }
}

/// Block medians of the two builds, one pair per turn, per benchmark taken in turns.
#[derive(Debug, Clone, Default)]
pub struct Pairs {
    /// Benchmark name, and the `(baseline, new)` medians of its turns.
    pub benchmarks: Vec<(String, Vec<(f64, f64)>)>,
}

impl Pairs {
    /// The `new / old` ratios of benchmark `name`'s turns.
    pub fn ratios(&self, name: &str) -> Option<Vec<f64>> {
        self.benchmarks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, pairs)| pairs.iter().map(|(old, new)| new / old).collect())
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile_sorted(&sorted, 50.0)
}

/// Paces the runs of the baseline's build and the new build through their suites. A benchmark
/// both are ready for is measured in at least `pairs` turns (and until each side has the time
/// and samples of `config`), alternating which build goes first; one that only one build has,
/// or that the two reach at different points, is measured by each alone.
pub fn conduct<R1: BufRead, W1: Write, R2: BufRead, W2: Write>(
    baseline: &mut Paced<R1, W1>,
    new: &mut Paced<R2, W2>,
    config: &Config,
    pairs: usize,
) -> Result<Pairs, BenchError> {
    let pairs = pairs.max(MIN_PAIRS);
    let block = config.min_time.as_secs_f64() / pairs as f64;
    let mut taken = Pairs::default();
    let (mut old_event, mut new_event) = (baseline.next_event()?, new.next_event()?);
    loop {
        match (&old_event, &new_event) {
            (Event::Ready(a), Event::Ready(b)) if a == b => {
                let turns = in_turns(baseline, new, config, pairs, block)?;
                eprintln!("  {a}: {} turns", turns.len());
                taken.benchmarks.push((a.clone(), turns));
                baseline.tell("done")?;
                new.tell("done")?;
                (old_event, new_event) = (baseline.next_event()?, new.next_event()?);
            }
            (Event::Finished, Event::Finished) => return Ok(taken),
            (old_state, new_state) => {
                if let Event::Ready(name) = old_state {
                    eprintln!("  {name}: {} alone", baseline.label);
                    baseline.samples("alone")?;
                    baseline.tell("done")?;
                    old_event = baseline.next_event()?;
                }
                if let Event::Ready(name) = new_state {
                    eprintln!("  {name}: {} alone", new.label);
                    new.samples("alone")?;
                    new.tell("done")?;
                    new_event = new.next_event()?;
                }
            }
        }
    }
}

/// Turns of one benchmark: block medians `(baseline, new)`.
fn in_turns<R1: BufRead, W1: Write, R2: BufRead, W2: Write>(
    baseline: &mut Paced<R1, W1>,
    new: &mut Paced<R2, W2>,
    config: &Config,
    pairs: usize,
    block: f64,
) -> Result<Vec<(f64, f64)>, BenchError> {
    let command = format!("block {block}");
    let mut turns = Vec::new();
    let (mut old_spent, mut new_spent) = (Vec::new(), Vec::new());
    let enough = |spent: &Vec<f64>| {
        spent.len() >= config.min_samples
            && spent.iter().sum::<f64>() >= config.min_time.as_secs_f64()
    };
    while turns.len() < pairs || !enough(&old_spent) || !enough(&new_spent) {
        let (old, new) = if turns.len() % 2 == 0 {
            let old = baseline.samples(&command)?;
            (old, new.samples(&command)?)
        } else {
            let new = new.samples(&command)?;
            (baseline.samples(&command)?, new)
        };
        turns.push((median(&old), median(&new)));
        old_spent.extend(old);
        new_spent.extend(new);
    }
    Ok(turns)
}

impl Comparison {
    /// Compares the new build's run `new` with the baseline build's run `old`, taken in turns
    /// (`pairs`); `saved` is the baseline's saved run, `baseline` its name. A benchmark taken in
    /// turns regressed when the median of its turns' ratios grew by more than `threshold` and its
    /// 99% interval leaves out no change; one measured alone is read as against saved numbers.
    pub fn paired(
        baseline: &str,
        saved: &SuiteRun,
        old: &SuiteRun,
        new: &SuiteRun,
        pairs: &Pairs,
        threshold: f64,
    ) -> Self {
        let mut comparison = Comparison::new(baseline, old, new, threshold);
        for row in &mut comparison.rows {
            if row.verdict == Verdict::New || row.verdict == Verdict::Missing {
                continue;
            }
            let Some(paired) = pairs
                .ratios(&row.result.name)
                .and_then(|ratios| paired_change(&ratios))
            else {
                continue;
            };
            *row = Row {
                result: row.result.clone(),
                change: Some(paired.change),
                noise: Some(paired.noise),
                verdict: Verdict::of(paired.change, paired.beyond_noise, threshold),
            };
        }
        comparison.method = Method::InTurns {
            baseline_drift: drift(saved, old),
        };
        comparison
    }
}

/// How much slower the baseline's build ran in `old` than in its saved run: the geometric mean
/// over benchmarks of the ratio of medians, minus 1.
fn drift(saved: &SuiteRun, old: &SuiteRun) -> Option<f64> {
    let logs: Vec<f64> = saved
        .results
        .iter()
        .filter_map(|before| {
            let now = old.results.iter().find(|r| r.key() == before.key())?;
            Some((now.summary.median / before.summary.median).ln())
        })
        .filter(|l| l.is_finite())
        .collect();
    (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp() - 1.0)
}

#[cfg(test)]
mod tests {
    use std::hint::black_box;
    use std::io::BufReader;
    use std::time::Duration;

    use burn::backend::Flex;
    use burn::tensor::backend::Backend;
    use kiln_core::Policy;

    use super::*;
    use crate::bench::{Benchmark, Work};
    use crate::runner::Runner;

    /// A synthetic workload: `rounds` rounds of integer mixing on each core, as the suite's
    /// kernels spread their work over every core; its time scales with `rounds`.
    struct Spin {
        name: &'static str,
        rounds: u64,
    }

    impl<B: Backend> Benchmark<B> for Spin {
        type Input = u64;
        type Output = u64;

        fn name(&self) -> String {
            self.name.to_string()
        }

        fn work(&self) -> Work {
            Work::items(1)
        }

        fn prepare(&self, _: &B::Device, variant: usize) -> u64 {
            variant as u64 + 1
        }

        fn run(&self, seed: &u64) -> u64 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let mix = |mut x: u64| {
                for _ in 0..black_box(self.rounds) {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).rotate_left(17) ^ 0x9e37;
                }
                x
            };
            std::thread::scope(|scope| {
                let threads: Vec<_> = (0..cores as u64)
                    .map(|core| scope.spawn(move || mix(*seed + core)))
                    .collect();
                threads
                    .into_iter()
                    .map(|t| t.join().unwrap_or(0))
                    .fold(0, |a, b| a ^ b)
            })
        }
    }

    const CONFIG: Config = Config {
        warmup: Duration::from_millis(5),
        min_time: Duration::from_millis(100),
        min_samples: 10,
        variants: 2,
    };

    /// A suite of three spins (about 1, 2 and 4 ms unoptimised), `scale` times the baseline's
    /// work, run with `pacer`.
    fn suite(scale: f64, pacer: impl Pacer) -> SuiteRun {
        let device = Default::default();
        let mut runner =
            Runner::<Flex>::new(&device, "cpu", Policy::full(), CONFIG).with_pacer(pacer);
        for (name, rounds) in [("spin/a", 1e5), ("spin/b", 2e5), ("spin/c", 4e5)] {
            let rounds = (rounds * scale) as u64;
            runner.bench(&Spin { name, rounds }).unwrap();
        }
        runner.finish().0
    }

    /// The two builds as threads that take their samples in turns, as two processes do.
    fn compare(scale: f64) -> Comparison {
        let paced = |scale: f64| {
            let (commands_in, commands_out) = std::io::pipe().unwrap();
            let (replies_in, replies_out) = std::io::pipe().unwrap();
            let run = std::thread::spawn(move || {
                suite(
                    scale,
                    Lockstep::new(BufReader::new(commands_in), replies_out),
                )
            });
            (run, BufReader::new(replies_in), commands_out)
        };
        let (old_run, old_replies, old_commands) = paced(1.0);
        let (new_run, new_replies, new_commands) = paced(scale);
        let pairs = conduct(
            &mut Paced::new("baseline", old_replies, old_commands),
            &mut Paced::new("new", new_replies, new_commands),
            &CONFIG,
            DEFAULT_PAIRS,
        )
        .unwrap();
        let (old, new) = (old_run.join().unwrap(), new_run.join().unwrap());
        Comparison::paired("synthetic", &old, &old, &new, &pairs, 0.05)
    }

    /// The bar on a 2-vCPU VM, whose speed jumps by half for a second at a time: the
    /// same code compared with itself passes at least 9 times in 10, and a real 20% slowdown of
    /// the suite is caught (the comparison reports a regression: the command exits 1) as often.
    /// How often each slowed benchmark is flagged on its own is printed (`-- --nocapture`).
    #[test]
    fn the_same_build_passes_and_a_20_percent_slowdown_is_caught() {
        let passes = (0..10).filter(|_| !compare(1.0).regressed()).count();
        let (mut caught, mut flagged, mut rows) = (0, 0, 0);
        for _ in 0..10 {
            let comparison = compare(1.2);
            caught += usize::from(comparison.regressed());
            rows += comparison.rows.len();
            flagged += (comparison.rows.iter())
                .filter(|r| r.verdict == Verdict::Regressed)
                .count();
        }
        eprintln!(
            "the same build passed {passes} of 10 times; a 20% slowdown was caught {caught} of 10 \
             times, {flagged} of its {rows} benchmarks flagged"
        );
        assert!(passes >= 9, "the same build passed {passes} of 10 times");
        assert!(
            caught >= 9,
            "a 20% slowdown was caught {caught} of 10 times"
        );
    }
}
