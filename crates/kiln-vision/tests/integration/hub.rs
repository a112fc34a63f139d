//! Checkpoints named by Hugging Face id: found in a Hugging Face cache without network (single
//! and sharded weights), and a clear error when neither the cache nor the server has them.
//! Without the `hub` feature an id that is not a directory says which feature fetches it.

use kiln_core::checkpoint_dir;

use crate::support;

use support::fixtures;

#[cfg(not(feature = "hub"))]
#[test]
fn without_the_hub_feature_an_id_names_the_feature() {
    let err = checkpoint_dir("google/siglip2-base-patch16-224")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`hub` feature"), "{err}");
}

#[test]
fn a_local_directory_is_used_as_it_is() {
    let dir = fixtures().join("clip_vision");
    assert_eq!(checkpoint_dir(dir.to_str().unwrap()).unwrap(), dir);
}

#[cfg(feature = "hub")]
mod from_the_cache {
    use std::path::Path;

    use burn::backend::Flex;
    use kiln_core::{Hub, Policy};
    use kiln_vision::VisionModel;

    use super::support::{Reference, fixtures, relative_error};

    /// A Hugging Face cache holding `fixture`'s files as `huggingface_hub` lays them out:
    /// `models--org--name/{refs/main, snapshots/<commit>/...}`.
    fn cache_with(cache: &Path, id: &str, fixture: &str) {
        let repo = cache.join(format!("models--{}", id.replace('/', "--")));
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), commit).unwrap();
        let snapshot = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snapshot).unwrap();
        for entry in std::fs::read_dir(fixtures().join(fixture)).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, snapshot.join(path.file_name().unwrap())).unwrap();
        }
    }

    /// No server: the endpoint refuses connections, so only the cache can answer.
    fn offline(cache: &Path) -> Hub {
        Hub::from_env()
            .with_cache_dir(cache)
            .with_endpoint("http://127.0.0.1:9")
    }

    #[test]
    fn a_cached_checkpoint_loads_without_network() {
        let cache = tempfile::tempdir().unwrap();
        for (id, fixture, key) in [
            ("kiln-test/clip-vision", "clip_vision", "image_embeds"),
            (
                "kiln-test/siglip-sharded",
                "siglip_full",
                "pooler_output_from_bf16",
            ),
        ] {
            cache_with(cache.path(), id, fixture);
            let dir = offline(cache.path()).fetch(id).unwrap();
            assert!(dir.starts_with(cache.path()), "{}", dir.display());
            let model =
                VisionModel::<Flex>::from_hf_dir(&dir, &Default::default(), &Policy::full())
                    .unwrap();
            let reference = Reference::open(fixture);
            let error = relative_error(
                model.forward(reference.input("pixel_values")),
                &reference,
                key,
            );
            assert!(error <= 1e-4, "{id}: {error}");
        }
    }

    #[test]
    fn a_checkpoint_nowhere_to_be_found_is_an_error_naming_it() {
        let cache = tempfile::tempdir().unwrap();
        let err = offline(cache.path())
            .fetch("kiln-test/absent")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kiln-test/absent") && err.contains("config.json"),
            "{err}"
        );
        // A cached config without its weights is not a checkpoint either.
        cache_with(cache.path(), "kiln-test/partial", "clip_vision");
        let snapshot = offline(cache.path()).fetch("kiln-test/partial").unwrap();
        std::fs::remove_file(snapshot.join("model.safetensors")).unwrap();
        let err = offline(cache.path())
            .fetch("kiln-test/partial")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.safetensors"), "{err}");
    }
}
