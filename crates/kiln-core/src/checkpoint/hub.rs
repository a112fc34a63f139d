//! Where a checkpoint comes from: a local directory, or (with the `hub` feature) a Hugging Face
//! model id fetched into the standard Hugging Face cache, `$HF_HOME/hub` (by default
//! `~/.cache/huggingface/hub`), where Python's `huggingface_hub` finds the same files. Every
//! model family loads through it: vision towers, language models, foveated models and PaiNN
//! potentials saved by kiln.

use std::path::PathBuf;

use super::CheckpointError;

/// The checkpoint directory `model` names: an existing directory as it is (never touching the
/// network); otherwise, with the `hub` feature, a Hugging Face model id (`org/name`, or
/// `org/name@revision`) fetched through [`Hub::from_env`].
///
/// ```no_run
/// let dir = kiln_core::checkpoint_dir("google/siglip2-base-patch16-224")?;
/// # Ok::<(), kiln_core::CheckpointError>(())
/// ```
pub fn checkpoint_dir(model: &str) -> Result<PathBuf, CheckpointError> {
    let path = PathBuf::from(model);
    if path.is_dir() {
        return Ok(path);
    }
    #[cfg(feature = "hub")]
    {
        Hub::from_env().fetch(model)
    }
    #[cfg(not(feature = "hub"))]
    {
        Err(CheckpointError::NotFound {
            name: model.into(),
            reason: "no such directory (kiln fetches Hugging Face ids when built with the `hub` \
                     feature)"
                .into(),
        })
    }
}

#[cfg(feature = "hub")]
pub use fetch::Hub;

#[cfg(feature = "hub")]
mod fetch {
    use std::path::{Path, PathBuf};

    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};

    use super::super::{CheckpointError, shards};

    /// The files of a checkpoint besides its weights, fetched when the repository has them: a
    /// vision tower's preprocessing, a language model's tokenizer and generation defaults.
    const OPTIONAL_FILES: [&str; 4] = [
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ];
    const CONFIG: &str = "config.json";
    const SINGLE: &str = "model.safetensors";
    const INDEX: &str = "model.safetensors.index.json";

    /// Fetches checkpoints from the Hugging Face Hub into a Hugging Face cache.
    #[derive(Debug, Clone)]
    pub struct Hub {
        cache: PathBuf,
        endpoint: Option<String>,
    }

    impl Hub {
        /// The cache `huggingface_hub` uses (`$HF_HOME/hub`, else `~/.cache/huggingface/hub`)
        /// and the endpoint `$HF_ENDPOINT`, else huggingface.co.
        pub fn from_env() -> Self {
            Hub {
                cache: Cache::from_env().path().clone(),
                endpoint: std::env::var("HF_ENDPOINT").ok(),
            }
        }

        /// Another cache directory (the `hub` directory itself, holding `models--org--name`).
        pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
            self.cache = dir.into();
            self
        }

        /// Another server.
        pub fn with_endpoint(mut self, url: impl Into<String>) -> Self {
            self.endpoint = Some(url.into());
            self
        }

        /// The snapshot directory of model `id` (`org/name[@revision]`) holding its config and
        /// weights: straight from the cache when every file is there (no network), else
        /// downloaded into it with a progress bar.
        pub fn fetch(&self, id: &str) -> Result<PathBuf, CheckpointError> {
            let not_found = |reason: String| CheckpointError::NotFound {
                name: id.into(),
                reason,
            };
            let repo = match id.split_once('@') {
                Some((name, revision)) => {
                    Repo::with_revision(name.into(), RepoType::Model, revision.into())
                }
                None => Repo::model(id.into()),
            };
            if let Some(dir) = self.cached(&repo) {
                return Ok(dir);
            }
            let mut builder =
                ApiBuilder::from_cache(Cache::new(self.cache.clone())).with_progress(true);
            if let Some(endpoint) = &self.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            let api = builder
                .build()
                .map_err(|e| not_found(e.to_string()))?
                .repo(repo);
            let get = |file: &str| {
                api.get(file)
                    .map_err(|e| not_found(format!("cannot fetch {file}: {e}")))
            };
            let config = get(CONFIG)?;
            for optional in OPTIONAL_FILES {
                // Absent from many repositories; the model loads without them.
                let _ = api.get(optional);
            }
            if let Err(single) = get(SINGLE) {
                let index = get(INDEX).map_err(|index| {
                    not_found(format!("{single}; and the sharded form: {index}"))
                })?;
                for shard in shards(&index)? {
                    get(&shard)?;
                }
            }
            Ok(parent(&config))
        }

        /// The snapshot directory when the cache holds the config and every weight file.
        fn cached(&self, repo: &Repo) -> Option<PathBuf> {
            let cache = Cache::new(self.cache.clone()).repo(repo.clone());
            let config = cache.get(CONFIG)?;
            let complete = cache.get(SINGLE).is_some()
                || cache.get(INDEX).is_some_and(|index| {
                    shards(&index).is_ok_and(|shards| shards.iter().all(|s| cache.get(s).is_some()))
                });
            complete.then(|| parent(&config))
        }
    }

    fn parent(file: &Path) -> PathBuf {
        file.parent().map(Path::to_path_buf).unwrap_or_default()
    }
}
