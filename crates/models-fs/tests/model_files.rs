//! Behaviour of `FsModelFiles`: path checks, digests and re-verification.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may panic on setup failures.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use lmsp_domain::ports::{ModelFileError, ModelFiles};
use lmsp_models_fs::{
    hash_file_with_progress, write_reference_corpus, FsModelFiles, REFERENCE_CORPUS,
};

const ABC_SHA256: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

fn setup() -> (tempfile::TempDir, std::path::PathBuf, FsModelFiles) {
    let root = tempfile::tempdir().unwrap();
    let models = root.path().join("models");
    fs::create_dir_all(&models).unwrap();
    let files = FsModelFiles::new(models.clone());
    (root, models, files)
}

fn set_mtime(path: &Path, at: SystemTime) {
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_modified(at).unwrap();
}

#[tokio::test]
async fn the_digest_of_known_content_is_its_sha256() {
    let (_root, models, files) = setup();
    fs::write(models.join("abc.txt"), "abc").unwrap();
    let print = files.fingerprint("abc.txt").await.unwrap();
    assert_eq!(print.digest.as_str(), ABC_SHA256);
    assert_eq!(print.size_bytes, 3);
    assert_eq!(
        print.path,
        fs::canonicalize(models.join("abc.txt"))
            .unwrap()
            .to_string_lossy()
    );
    let absolute = models.join("abc.txt");
    let again = files
        .fingerprint(&absolute.to_string_lossy())
        .await
        .unwrap();
    assert_eq!(again, print);
}

#[tokio::test]
async fn traversal_and_outside_paths_are_rejected() {
    let (root, models, files) = setup();
    fs::write(root.path().join("secret.txt"), "secret").unwrap();
    fs::create_dir_all(models.join("sub")).unwrap();
    for path in [
        String::from("../secret.txt"),
        String::from("sub/../../secret.txt"),
        root.path()
            .join("secret.txt")
            .to_string_lossy()
            .into_owned(),
        models
            .join("..")
            .join("secret.txt")
            .to_string_lossy()
            .into_owned(),
        String::from("/etc/hostname"),
        String::from("missing.txt"),
        String::new(),
    ] {
        let result = files.fingerprint(&path).await;
        assert!(
            matches!(result, Err(ModelFileError::PathRejected(_))),
            "{path:?}: {result:?}"
        );
    }
}

#[cfg(unix)]
#[tokio::test]
async fn symlinks_escaping_the_directory_are_rejected_and_inner_ones_followed() {
    let (root, models, files) = setup();
    fs::write(root.path().join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(root.path().join("secret.txt"), models.join("escape.txt")).unwrap();
    std::os::unix::fs::symlink(root.path(), models.join("up")).unwrap();
    for path in ["escape.txt", "up/secret.txt"] {
        let result = files.fingerprint(path).await;
        assert!(
            matches!(result, Err(ModelFileError::PathRejected(_))),
            "{path}: {result:?}"
        );
    }
    fs::write(models.join("real.txt"), "abc").unwrap();
    std::os::unix::fs::symlink(models.join("real.txt"), models.join("alias.txt")).unwrap();
    let print = files.fingerprint("alias.txt").await.unwrap();
    assert_eq!(print.digest.as_str(), ABC_SHA256);
    assert!(print.path.ends_with("real.txt"), "{}", print.path);
}

#[tokio::test]
async fn non_regular_files_are_rejected() {
    let (_root, models, files) = setup();
    fs::create_dir_all(models.join("adir")).unwrap();
    for path in ["adir", ".", ""] {
        let result = files.fingerprint(path).await;
        assert!(
            matches!(result, Err(ModelFileError::PathRejected(_))),
            "{path:?}: {result:?}"
        );
    }
    let dir = models.to_string_lossy().into_owned();
    assert!(matches!(
        files.fingerprint(&dir).await,
        Err(ModelFileError::PathRejected(_))
    ));
}

#[cfg(unix)]
#[tokio::test]
async fn a_device_linked_into_the_directory_is_rejected() {
    let (_root, models, files) = setup();
    // /dev/null resolves outside anyway; a fifo inside the directory is the real test.
    let fifo = models.join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if matches!(made, Ok(status) if status.success()) {
        let result = files.fingerprint("pipe").await;
        assert!(
            matches!(result, Err(ModelFileError::PathRejected(_))),
            "{result:?}"
        );
    }
}

#[tokio::test]
async fn verify_skips_the_hash_when_size_and_mtime_are_unchanged() {
    let (_root, models, files) = setup();
    let path = models.join("m.txt");
    fs::write(&path, "abc").unwrap();
    let print = files.fingerprint("m.txt").await.unwrap();
    assert_eq!(files.verify(&print).await, Ok(None));

    // Same size and mtime but a wrong stored digest: not re-hashed, so still Ok(None).
    let mut forged = print.clone();
    forged.digest = lmsp_domain::model::Digest::from_sha256([7; 32]);
    assert_eq!(files.verify(&forged).await, Ok(None));
}

#[tokio::test]
async fn verify_rehashes_when_the_mtime_changed_and_the_content_still_matches() {
    let (_root, models, files) = setup();
    let path = models.join("m.txt");
    fs::write(&path, "abc").unwrap();
    let print = files.fingerprint("m.txt").await.unwrap();
    set_mtime(&path, SystemTime::now() + Duration::from_secs(3600));
    let rehashed = files.verify(&print).await.unwrap().unwrap();
    assert_eq!(rehashed.digest, print.digest);
    assert_ne!(rehashed.modified_millis, print.modified_millis);
    assert_eq!(files.verify(&rehashed).await, Ok(None));
}

#[tokio::test]
async fn verify_reports_a_changed_file_as_a_digest_mismatch() {
    let (_root, models, files) = setup();
    let path = models.join("m.txt");
    fs::write(&path, "abc").unwrap();
    let print = files.fingerprint("m.txt").await.unwrap();
    fs::write(&path, "abd").unwrap();
    set_mtime(&path, SystemTime::now() + Duration::from_secs(3600));
    assert_eq!(
        files.verify(&print).await,
        Err(ModelFileError::DigestMismatch)
    );
    fs::write(&path, "abcdef").unwrap();
    assert_eq!(
        files.verify(&print).await,
        Err(ModelFileError::DigestMismatch)
    );
}

#[tokio::test]
async fn verify_reports_a_missing_file_as_unavailable() {
    let (_root, models, files) = setup();
    let path = models.join("m.txt");
    fs::write(&path, "abc").unwrap();
    let print = files.fingerprint("m.txt").await.unwrap();
    fs::remove_file(&path).unwrap();
    assert!(matches!(
        files.verify(&print).await,
        Err(ModelFileError::Unavailable(_))
    ));
}

#[test]
fn progress_is_reported_in_chunks_up_to_the_total() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("big.bin");
    let size = 64 * 1024 * 3 + 17;
    fs::write(&path, vec![0x5a_u8; size]).unwrap();
    let mut calls = Vec::new();
    let print = hash_file_with_progress(&path, |done, total| calls.push((done, total))).unwrap();
    assert_eq!(print.size_bytes, size as u64);
    assert_eq!(calls.first(), Some(&(0, size as u64)));
    assert_eq!(calls.last(), Some(&(size as u64, size as u64)));
    assert_eq!(calls.len(), 5);
    assert!(calls.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn the_reference_corpus_is_written_once_and_never_overwritten() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("models").join("reference.txt");
    assert!(write_reference_corpus(&path).unwrap());
    assert_eq!(fs::read_to_string(&path).unwrap(), REFERENCE_CORPUS);
    fs::write(&path, "the user's own text").unwrap();
    assert!(!write_reference_corpus(&path).unwrap());
    assert_eq!(fs::read_to_string(&path).unwrap(), "the user's own text");
    let words = REFERENCE_CORPUS.split_whitespace().count();
    assert!(
        (2_000..=4_500).contains(&REFERENCE_CORPUS.len()),
        "{}",
        REFERENCE_CORPUS.len()
    );
    assert!(words > 300, "{words}");
}
