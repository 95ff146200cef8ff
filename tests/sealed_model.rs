//! Sealed models (issue 10): a sealed copy of a fixture opens to the same files and digest and
//! reproduces the golden outputs; every refusal (wrong key, tampered, reordered or truncated
//! chunk, changed manifest) is final and names its cause; `inferno seal` and `inferno serve`
//! with a key file work end to end, and a refused start-up exits 1 with one line and an audit
//! record.

mod sealed_serve_support;
mod support;

use sealed_serve_support::{
    dev_config, inferno, key_releases, refused_serve, serve_args, spawn_until_listening, terminate,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use inferno::engine::EngineConfig;
use inferno::model::{Model, ModelDigest};
use inferno::seal::manifest::MIN_CHUNK_SIZE;
use inferno::seal::{ModelKey, SealError, SealOptions, open_sealed, seal_dir};
use support::{committed_fixture, engine, golden, greedy, run, shared_fixture};

/// Seals `plain` into `work/sealed` under a fresh key with `chunk_size`.
fn seal(plain: &Path, work: &Path, chunk_size: u64) -> (PathBuf, ModelKey) {
    let key = ModelKey::generate().unwrap();
    let out = work.join("sealed");
    let options = SealOptions {
        chunk_size,
        ..SealOptions::default()
    };
    seal_dir(plain, &out, &key, &options).expect("sealing works");
    (out, key)
}

/// The sealed copy opens to the plaintext's digest and reproduces every golden greedy output.
fn check_sealed_golden(plain: &Path) {
    let work = tempfile::tempdir().unwrap();
    let (sealed, key) = seal(plain, work.path(), MIN_CHUNK_SIZE);
    let (manifest, files) = open_sealed(&sealed, &key).expect("the sealed copy opens");
    let reference = ModelDigest::of_dir(plain).unwrap();
    assert_eq!(files.digest(), &reference);
    assert_eq!(manifest.model_digest, reference.hex);
    let model = Model::from_files(&files, "sealed".into()).expect("the sealed model loads");
    drop(files);
    assert_eq!(model.digest, reference);

    let config = EngineConfig {
        max_batched_tokens: 128,
        kv_cache_bytes: 64 << 20,
        ..Default::default()
    };
    let engine = engine(&model, config);
    for (i, case) in golden(plain).iter().enumerate() {
        let out = run(&engine, greedy(&case.input_ids, case.greedy_24.len()));
        assert_eq!(
            out.tokens,
            case.greedy_24,
            "case {i} of {}",
            plain.display()
        );
    }
    engine.shutdown();
}

#[test]
fn sealed_committed_fixture_reproduces_the_golden_outputs() {
    check_sealed_golden(&committed_fixture("inferno-tiny"));
}

#[test]
#[cfg_attr(not(shared_fixture), ignore = "needs ../shared/fixtures/tiny-llama3")]
fn sealed_shared_tiny_llama3_reproduces_the_golden_outputs() {
    check_sealed_golden(&shared_fixture("tiny-llama3"));
}

/// The sealed committed fixture (4 KiB chunks, so the weights span many chunks).
fn sealed_fixture() -> (tempfile::TempDir, PathBuf, ModelKey) {
    let work = tempfile::tempdir().unwrap();
    let (sealed, key) = seal(
        &committed_fixture("inferno-tiny"),
        work.path(),
        MIN_CHUNK_SIZE,
    );
    (work, sealed, key)
}

fn weights(sealed: &Path) -> PathBuf {
    sealed.join("model.safetensors.sealed")
}

#[test]
fn a_wrong_key_is_refused_before_any_chunk_is_read() {
    let (_work, sealed, _) = sealed_fixture();
    let err = open_sealed(&sealed, &ModelKey::generate().unwrap()).unwrap_err();
    assert!(matches!(err, SealError::WrongKey { .. }), "{err}");
    assert!(err.to_string().starts_with("wrong model key"), "{err}");
}

#[test]
fn a_changed_byte_anywhere_in_a_chunk_is_refused() {
    let (_work, sealed, key) = sealed_fixture();
    let path = weights(&sealed);
    let mut bytes = std::fs::read(&path).unwrap();
    let chunk = MIN_CHUNK_SIZE as usize + 16;
    bytes[2 * chunk + 100] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let err = open_sealed(&sealed, &key).unwrap_err();
    assert!(matches!(err, SealError::Chunk { index: 2, .. }), "{err}");
}

#[test]
fn reordered_chunks_are_refused() {
    let (_work, sealed, key) = sealed_fixture();
    let path = weights(&sealed);
    let mut bytes = std::fs::read(&path).unwrap();
    let chunk = MIN_CHUNK_SIZE as usize + 16;
    let (first, rest) = bytes.split_at_mut(chunk);
    first.swap_with_slice(&mut rest[..chunk]);
    std::fs::write(&path, &bytes).unwrap();
    let err = open_sealed(&sealed, &key).unwrap_err();
    assert!(matches!(err, SealError::Chunk { .. }), "{err}");
}

#[test]
fn a_truncated_file_or_a_dropped_last_chunk_is_refused() {
    let (_work, sealed, key) = sealed_fixture();
    let path = weights(&sealed);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let err = open_sealed(&sealed, &key).unwrap_err();
    assert!(matches!(err, SealError::Length { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn chunks_from_another_sealing_under_the_same_key_are_refused() {
    let work = tempfile::tempdir().unwrap();
    let plain = committed_fixture("inferno-tiny");
    let key = ModelKey::generate().unwrap();
    let options = SealOptions {
        chunk_size: MIN_CHUNK_SIZE,
        ..SealOptions::default()
    };
    let a = work.path().join("a");
    let b = work.path().join("b");
    seal_dir(&plain, &a, &key, &options).unwrap();
    seal_dir(&plain, &b, &key, &options).unwrap();
    // Same key, same plaintext, same lengths: only the salt and header digest differ.
    std::fs::copy(weights(&b), weights(&a)).unwrap();
    let err = open_sealed(&a, &key).unwrap_err();
    assert!(matches!(err, SealError::Chunk { index: 0, .. }), "{err}");
}

#[test]
fn a_changed_manifest_fails_every_chunk() {
    let (_work, sealed, key) = sealed_fixture();
    let path = sealed.join(inferno::seal::MANIFEST_FILE);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // Still a valid manifest, but not the one the chunks were sealed under.
    manifest["release"]["model_id"] = "other".into();
    std::fs::write(&path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let err = open_sealed(&sealed, &key).unwrap_err();
    assert!(matches!(err, SealError::Chunk { .. }), "{err}");
}

/// Seals the committed fixture with `inferno seal --key-file` (creating the key).
fn seal_with_cli(work: &Path) -> (PathBuf, PathBuf) {
    let plain = committed_fixture("inferno-tiny");
    let sealed = work.join("sealed");
    let key = work.join("model.key");
    let (code, stdout, stderr) = inferno(&[
        "seal",
        "--model",
        plain.to_str().unwrap(),
        "--out",
        sealed.to_str().unwrap(),
        "--key-file",
        key.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let digest = ModelDigest::of_dir(&plain).unwrap().hex;
    assert!(stdout.contains(&digest), "{stdout}");
    assert!(stdout.contains("new key written"), "{stdout}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    (sealed, key)
}

/// A development configuration in `dir` whose model key comes from the key file `key`.
fn key_file_config(dir: &Path, key: &Path) -> PathBuf {
    dev_config(
        dir,
        &format!(
            "[model.key]\nsource = \"file\"\npath = \"{}\"\n",
            key.display()
        ),
    )
}

#[test]
fn serve_opens_a_sealed_model_with_a_key_file_and_records_the_release() {
    let work = tempfile::tempdir().unwrap();
    let (sealed, key) = seal_with_cli(work.path());
    let config = key_file_config(work.path(), &key);
    let (child, banner) = spawn_until_listening(&serve_args(&sealed, &config));
    let digest = ModelDigest::of_dir(&committed_fixture("inferno-tiny"))
        .unwrap()
        .hex;
    assert!(banner.contains(&digest), "{banner}");
    // SIGTERM: a clean stop writes the log's final records.
    terminate(child);
    let releases = key_releases(&work.path().join("audit"));
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(releases[0].0, "{releases:?}");
}

/// `inferno serve` on `sealed` with `extra` config and `args`: must exit 1 with one error line
/// containing `expected`, and record one refused key release.
fn assert_serve_refuses(work: &Path, sealed: &Path, extra: &str, args: &[&str], expected: &str) {
    let config = dev_config(work, extra);
    let mut all = serve_args(sealed, &config);
    all.extend_from_slice(args);
    let (error, stderr, reason) = refused_serve(&all, &work.join("audit"));
    assert!(error.contains(expected), "{stderr}");
    assert!(reason.contains(expected), "{reason}");
}

#[test]
fn serve_refuses_a_sealed_model_with_a_wrong_key_or_no_key() {
    let work = tempfile::tempdir().unwrap();
    let (sealed, _) = seal_with_cli(work.path());
    let wrong = work.path().join("wrong.key");
    ModelKey::read_or_create(&wrong).unwrap();

    let run1 = work.path().join("run1");
    std::fs::create_dir(&run1).unwrap();
    assert_serve_refuses(
        &run1,
        &sealed,
        "",
        &["--model-key-file", wrong.to_str().unwrap()],
        "wrong model key",
    );

    let run2 = work.path().join("run2");
    std::fs::create_dir(&run2).unwrap();
    assert_serve_refuses(&run2, &sealed, "", &[], "no key source is configured");
}

#[test]
fn serve_refuses_a_tampered_sealed_model() {
    let work = tempfile::tempdir().unwrap();
    let (sealed, key) = seal_with_cli(work.path());
    let path = weights(&sealed);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&path, &bytes).unwrap();
    let run = work.path().join("run");
    std::fs::create_dir(&run).unwrap();
    assert_serve_refuses(
        &run,
        &sealed,
        "",
        &["--model-key-file", key.to_str().unwrap()],
        "failed authentication",
    );
}

#[test]
fn without_sev_snp_hardware_the_derived_key_source_refuses_in_one_line() {
    if Path::new(inferno::seal::snp::DEVICE).exists() {
        eprintln!("SKIPPED: this machine has /dev/sev-guest");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    // Sealing: nothing is written.
    let out = work.path().join("never");
    let blob = work.path().join("snp.json");
    let (code, _, stderr) = inferno(&[
        "seal",
        "--model",
        committed_fixture("inferno-tiny").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--snp-seal",
        blob.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/dev/sev-guest is absent"), "{stderr}");
    assert!(!out.exists() && !blob.exists());

    // Serving: refused before any chunk is read, recorded.
    let (sealed, _) = seal_with_cli(work.path());
    let params = inferno::seal::snp::SnpKeyParams::default();
    inferno::seal::snp::wrap(&ModelKey::generate().unwrap(), &params, &[1; 32])
        .write(&blob)
        .unwrap();
    let run = work.path().join("run");
    std::fs::create_dir(&run).unwrap();
    assert_serve_refuses(
        &run,
        &sealed,
        &format!(
            "[model.key]\nsource = \"snp\"\nblob = \"{}\"\n",
            blob.display()
        ),
        &[],
        "/dev/sev-guest is absent",
    );
}

/// A sealed file whose chunks do not line up with the digest's 16 MiB blocks opens to the
/// plaintext's digest: the sealed path hashes blocks at plaintext offsets.
#[test]
fn a_multi_block_sealed_file_opens_to_the_plaintext_digest() {
    let work = tempfile::tempdir().unwrap();
    let plain = work.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let block = inferno::model::digest::DIGEST_BLOCK;
    let big: Vec<u8> = (0..2 * block + 4321).map(|i| (i % 249) as u8).collect();
    std::fs::write(plain.join("big.bin"), &big).unwrap();
    std::fs::write(plain.join("empty"), b"").unwrap();
    let (sealed, key) = seal(&plain, work.path(), (5 << 20) + 3);
    let (manifest, files) = open_sealed(&sealed, &key).expect("opens");
    let reference = ModelDigest::of_dir(&plain).unwrap();
    assert_eq!(files.digest(), &reference);
    assert_eq!(manifest.model_digest, reference.hex);
    assert_eq!(files.get("big.bin").unwrap().as_slice(), &big[..]);
}

/// Serving a sealed model logs one start-up timeline line with every phase in milliseconds
/// before the banner; stderr here is a pipe, so no progress bar is drawn into it.
#[test]
fn serve_logs_one_start_up_timeline_and_no_progress_bar_into_a_pipe() {
    use std::io::BufRead as _;
    let work = tempfile::tempdir().unwrap();
    let (sealed, key) = seal_with_cli(work.path());
    let config = key_file_config(work.path(), &key);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(serve_args(&sealed, &config))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn inferno");
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    for line in stderr.lines().map_while(Result::ok) {
        seen.push_str(&line);
        seen.push('\n');
        if line.trim().starts_with("listening:") {
            break;
        }
    }
    terminate(child);
    let timelines: Vec<&str> = seen
        .lines()
        .filter(|l| l.contains("start-up timeline"))
        .collect();
    assert_eq!(timelines.len(), 1, "{seen}");
    for field in [
        "read_hash_ms=",
        "parse_ms=",
        "attest_ms=",
        "context_ms=",
        "kernels_ms=",
        "upload_ms=",
        "gemm_selection_ms=",
        "graphs_ms=",
        "engine_ms=",
        "total_ms=",
    ] {
        assert!(timelines[0].contains(field), "{field} in {}", timelines[0]);
    }
    let line_of = |wanted: &dyn Fn(&str) -> bool| seen.lines().position(|l| wanted(l.trim()));
    let timeline = line_of(&|l| l.contains("start-up timeline")).unwrap();
    let banner = line_of(&|l| l.starts_with("inferno ") && l.ends_with(" ready"));
    assert!(Some(timeline) < banner, "{seen}");
    eprintln!("{}", timelines[0]);
    assert!(!seen.contains('\r') && !seen.contains("[=="), "{seen}");
}

/// `--device cuda` opens the GPU on another thread while the sealed model is opened (after the
/// start-up attestation): without a GPU that is still one `CUDA backend:` error line and exit 1
/// (after the model was opened and its release recorded); with one, the server starts.
#[test]
fn serve_on_cuda_opens_the_gpu_beside_the_sealed_model_or_fails_in_one_line() {
    let work = tempfile::tempdir().unwrap();
    let (sealed, key) = seal_with_cli(work.path());
    let config = key_file_config(work.path(), &key);
    let mut args = serve_args(&sealed, &config);
    let cpu = args.iter().position(|a| *a == "cpu").unwrap();
    args[cpu] = "cuda";
    if inferno::backend::cuda::probe().is_ok() {
        let (child, banner) = spawn_until_listening(&args);
        terminate(child);
        assert!(banner.contains("backend:     cuda"), "{banner}");
        return;
    }
    let (code, _, stderr) = inferno(&args);
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].starts_with("error: CUDA backend:"), "{stderr}");
    let releases = key_releases(&work.path().join("audit"));
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert!(
        releases[0].0,
        "the key was released before the GPU was used: {releases:?}"
    );
}

/// Runs `inferno ARGS` under `umask 000`: exit code and standard error.
fn inferno_umask_000(args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 000 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 47, defect 4: `inferno seal` never writes through a link planted in its output
/// directory, and its outputs have their modes by intent, not by the umask.
#[test]
fn seal_never_writes_through_a_planted_link_and_sets_its_modes_whatever_the_umask() {
    let work = tempfile::tempdir().unwrap();
    let plain = committed_fixture("inferno-tiny");
    let seal_into = |out: &Path| {
        inferno_umask_000(&[
            "seal",
            "--model",
            plain.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--key-file",
            work.path().join("model.key").to_str().unwrap(),
        ])
    };

    // A link at the manifest's temporary name: refused in one line, the target untouched, no
    // manifest left behind.
    let planted = work.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    let victim = work.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let manifest = inferno::seal::MANIFEST_FILE;
    std::os::unix::fs::symlink(&victim, planted.join(format!(".{manifest}.tmp"))).unwrap();
    let (code, stderr) = seal_into(&planted);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(planted.join(manifest).symlink_metadata().is_err());

    // A fresh output directory under umask 000: 0700, the outputs 0644, the key file 0600.
    let fresh = work.path().join("fresh");
    let (code, stderr) = seal_into(&fresh);
    assert_eq!(code, Some(0), "{stderr}");
    let mode = |path: &Path| {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&fresh), 0o700);
    for entry in std::fs::read_dir(&fresh).unwrap() {
        let path = entry.unwrap().path();
        assert!(
            std::fs::symlink_metadata(&path).unwrap().is_file(),
            "{path:?}"
        );
        assert_eq!(mode(&path), 0o644, "{path:?}");
    }
    assert_eq!(mode(&work.path().join("model.key")), 0o600);
}

/// Makes a FIFO at `path` (0600).
fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .args(["-m", "600"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Runs `work` on a thread; its result, or a panic when it is still running after 10 s (it
/// waits for a FIFO's writer).
fn within_10s<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("refused at once instead of waiting for a FIFO's writer")
}

/// Issue 47, defect 5: a FIFO as a sealed chunk file, a key file or a model's text file is
/// refused before it is opened for reading, instead of waiting forever for a writer.
#[test]
fn fifos_are_refused_instead_of_hanging_the_load() {
    let (work, sealed, key) = sealed_fixture();
    std::fs::remove_file(weights(&sealed)).unwrap();
    mkfifo(&weights(&sealed));
    let err = within_10s(move || open_sealed(&sealed, &key).map(drop).unwrap_err());
    assert!(err.to_string().contains("not a regular file"), "{err}");

    let key_fifo = work.path().join("fifo.key");
    mkfifo(&key_fifo);
    let err = within_10s(move || ModelKey::read_or_create(&key_fifo).map(drop).unwrap_err());
    assert!(err.to_string().contains("not a regular file"), "{err}");

    let plain = work.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    for entry in std::fs::read_dir(committed_fixture("inferno-tiny")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), plain.join(entry.file_name())).unwrap();
    }
    std::fs::remove_file(plain.join("tokenizer.json")).unwrap();
    mkfifo(&plain.join("tokenizer.json"));
    let ahead = within_10s(move || inferno::model::TextAhead::parse(&plain).is_some());
    assert!(ahead, "config.json is a regular file and parses");
}
