//! Data-parallel training on burn's collective (`burn-collective`, the `collective` feature):
//! every participant — a device thread in one process, or a process per device on one or many
//! machines — runs the same loop on its own share of the micro-batches and averages the
//! gradients (and the logged values) by all-reduce before each optimizer step, so all hold the
//! same parameters. Participant `r` of `W` takes micro-batches `r, r + W, …` of the shared
//! seeded order: `W` participants with `k` micro-batches each step exactly like one with `W·k`.
//!
//! Processes find each other as torchrun or Slurm describe them ([`DataParallel::from_env`]):
//! rank 0 runs burn's global orchestrator on `MASTER_PORT`; each rank serves its tensors on
//! `MASTER_PORT + 1 + rank` (or `KILN_NODE_PORT`) at `KILN_NODE_ADDR` (default: loopback when
//! the master is local, else the host name).

use serde::{Deserialize, Serialize};

use crate::TrainError;

/// This participant's place in a data-parallel run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataParallel {
    /// This participant (0 writes the logs, plots and checkpoints).
    pub rank: usize,
    /// Participants in all.
    pub world: usize,
    /// Participants in this process (threads, one device each); the rest are other processes.
    pub local: usize,
    /// How processes meet (`None`: all participants are threads of this process).
    pub network: Option<Network>,
}

/// Where the processes of a run meet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Network {
    /// Host of rank 0, which runs the orchestrator.
    pub master_addr: String,
    /// The orchestrator's port.
    pub master_port: u16,
    /// This process's host, as the others reach it.
    pub node_addr: String,
    /// This process's tensor service port.
    pub node_port: u16,
}

impl DataParallel {
    /// `world` devices driven by threads of this process; this is thread `rank`.
    pub fn threads(rank: usize, world: usize) -> Self {
        DataParallel {
            rank,
            world,
            local: world,
            network: None,
        }
    }

    /// One process per device, from the environment torchrun sets (`RANK`, `WORLD_SIZE`,
    /// `MASTER_ADDR`, `MASTER_PORT`) or Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, with
    /// `MASTER_ADDR` and `MASTER_PORT` exported by the batch script). `None` for a single
    /// process.
    pub fn from_env() -> Result<Option<Self>, TrainError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`] over any variable source.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TrainError> {
        Self::read_vars(var).map_err(TrainError::Parallel)
    }

    fn read_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let number = |name: &str| -> Result<Option<usize>, String> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse()
                        .map_err(|_| format!("{name}={v} is not a whole number"))
                })
                .transpose()
        };
        let (rank, world) = match (number("RANK")?, number("WORLD_SIZE")?) {
            (Some(rank), Some(world)) => (rank, world),
            (None, None) => match (number("SLURM_PROCID")?, number("SLURM_NTASKS")?) {
                (Some(rank), Some(world)) => (rank, world),
                _ => return Ok(None),
            },
            _ => return Err("RANK and WORLD_SIZE go together".into()),
        };
        if world <= 1 {
            return Ok(None);
        }
        if rank >= world {
            return Err(format!("RANK {rank} is not below WORLD_SIZE {world}"));
        }
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let master_port = match var("MASTER_PORT") {
            Some(p) => p
                .parse()
                .map_err(|_| format!("MASTER_PORT={p} is not a port"))?,
            None => 29500,
        };
        let loopback = ["127.0.0.1", "localhost", "::1"].contains(&master_addr.as_str());
        let node_addr = match var("KILN_NODE_ADDR") {
            Some(addr) => addr,
            None if loopback => "127.0.0.1".into(),
            None => var("HOSTNAME").ok_or(
                "set KILN_NODE_ADDR to this machine's address as the other machines reach it",
            )?,
        };
        let node_port = match var("KILN_NODE_PORT") {
            Some(p) => p
                .parse()
                .map_err(|_| format!("KILN_NODE_PORT={p} is not a port"))?,
            None => u16::try_from(usize::from(master_port) + 1 + rank)
                .map_err(|_| format!("MASTER_PORT {master_port} + 1 + rank is not a port"))?,
        };
        Ok(Some(DataParallel {
            rank,
            world,
            local: 1,
            network: Some(Network {
                master_addr,
                master_port,
                node_addr,
                node_port,
            }),
        }))
    }

    /// Whether this participant writes logs, plots and checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// Why this description cannot work, if it cannot.
    pub fn validate(&self) -> Result<(), TrainError> {
        self.check().map_err(TrainError::Parallel)
    }

    /// Why this description cannot work, if it cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.world == 0 || self.rank >= self.world {
            return Err(format!(
                "participant {} of {} does not exist",
                self.rank, self.world
            ));
        }
        if self.local == 0 || !self.world.is_multiple_of(self.local) {
            return Err(format!(
                "{} participants per process do not divide {} in all",
                self.local, self.world
            ));
        }
        if self.network.is_none() && self.local != self.world {
            return Err("participants in other processes need a network".into());
        }
        Ok(())
    }
}

#[cfg(feature = "collective")]
pub(crate) use collective::Collective;

#[cfg(feature = "collective")]
mod collective {
    use std::str::FromStr;

    use burn::collective::{
        AllReduceStrategy, CollectiveConfig, PeerId, ReduceOperation, all_reduce,
        finish_collective, register,
    };
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorPrimitive};

    use super::DataParallel;
    use crate::TrainError;
    use crate::optimization::Averaging;

    /// A joined data-parallel group on backend `B`.
    pub(crate) struct Collective<B: Backend> {
        peer: PeerId,
        rank: usize,
        world: usize,
        backend: std::marker::PhantomData<B>,
    }

    fn failed(what: &str, e: impl std::fmt::Debug) -> TrainError {
        TrainError::Parallel(format!("{what}: {e:?}"))
    }

    impl<B: Backend> Collective<B> {
        /// Joins the group as `parallel` describes (rank 0 of a multi-process run starts the
        /// orchestrator first); returns when every participant has registered.
        pub(crate) fn join(
            parallel: &DataParallel,
            device: &B::Device,
        ) -> Result<Self, TrainError> {
            parallel.validate()?;
            let mut config = CollectiveConfig::default().with_num_devices(parallel.local);
            if let Some(network) = &parallel.network {
                if parallel.rank == 0 {
                    start_orchestrator(network.master_port)?;
                }
                let address = |host: &str, port: u16| {
                    burn_communication::Address::from_str(&format!("ws://{host}:{port}"))
                        .map_err(|e| failed("address", e))
                };
                // burn 0.21's global ring all-reduce stalls on its second call here (transfer
                // ids restart at 0 each call); the centralised one does not.
                config = config
                    .with_global_all_reduce_strategy(AllReduceStrategy::Centralized)
                    .with_num_nodes((parallel.world / parallel.local) as u32)
                    .with_global_address(address(&network.master_addr, network.master_port)?)
                    .with_node_address(address(&network.node_addr, network.node_port)?)
                    .with_data_service_port(network.node_port);
            }
            let peer = PeerId::from(parallel.rank as u32);
            register::<B>(peer, device.clone(), config)
                .map_err(|e| failed("joining the data-parallel group", e))?;
            Ok(Collective {
                peer,
                rank: parallel.rank,
                world: parallel.world,
                backend: std::marker::PhantomData,
            })
        }
    }

    impl<B: Backend> Averaging<B> for Collective<B> {
        fn place(&self) -> (usize, usize) {
            (self.rank, self.world)
        }

        fn mean(&self, values: Tensor<B, 1>) -> Result<Tensor<B, 1>, TrainError> {
            let primitive = values.into_primitive().tensor();
            all_reduce::<B>(self.peer, primitive, ReduceOperation::Mean)
                .map(|t| Tensor::from_primitive(TensorPrimitive::Float(t)))
                .map_err(|e| failed("averaging gradients", e))
        }
    }

    impl<B: Backend> Drop for Collective<B> {
        fn drop(&mut self) {
            if let Err(e) = finish_collective::<B>(self.peer) {
                log::warn!("leaving the data-parallel group: {e:?}");
            }
        }
    }

    /// burn's global orchestrator on `port`, on a thread of its own. It takes over Ctrl+C (its
    /// shutdown signal); the process ends when it stops, as Ctrl+C would have ended it.
    fn start_orchestrator(port: u16) -> Result<(), TrainError> {
        std::net::TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| failed(&format!("the orchestrator's port {port} (MASTER_PORT)"), e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| failed("the orchestrator's runtime", e))?;
        std::thread::Builder::new()
            .name("kiln-orchestrator".into())
            .spawn(move || {
                runtime.block_on(burn_collective::start_global_orchestrator(port));
                std::process::exit(130);
            })
            .map_err(|e| failed("the orchestrator's thread", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn torchrun_and_slurm_variables_describe_the_processes() {
        assert_eq!(DataParallel::from_vars(vars(&[])).unwrap(), None);
        assert_eq!(
            DataParallel::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap(),
            None
        );
        let p = DataParallel::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "4000"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((p.rank, p.world, p.local), (1, 2, 1));
        let network = p.network.unwrap();
        assert_eq!(network.master_addr, "127.0.0.1");
        assert_eq!(
            (network.node_addr.as_str(), network.node_port),
            ("127.0.0.1", 4002)
        );
        let slurm = DataParallel::from_vars(vars(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("MASTER_ADDR", "node01"),
            ("HOSTNAME", "node02"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((slurm.rank, slurm.world), (3, 4));
        assert_eq!(slurm.network.unwrap().node_addr, "node02");
    }

    #[test]
    fn inconsistent_variables_are_refused_with_the_reason() {
        let e = DataParallel::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not below"), "{e}");
        let e = DataParallel::from_vars(vars(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=x"), "{e}");
        let e = DataParallel::from_vars(vars(&[("RANK", "0")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("go together"), "{e}");
        let e = DataParallel::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("KILN_NODE_ADDR"), "{e}");
        assert!(DataParallel::threads(2, 2).validate().is_err());
    }
}
