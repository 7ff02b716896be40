//! Behaviour of `FsModelFiles`: path checks, digests and re-verification.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may panic on setup failures.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use lmsp_domain::model::Digest;
use lmsp_domain::ports::{ModelFileError, ModelFiles, Progress, VerifiedFile};
use lmsp_models_fs::{
    hash_file_with_progress, write_reference_corpus, FsModelFiles, REFERENCE_CORPUS, REFERENCE_FILE,
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
    // A file inside the models directory is recorded relative to it.
    assert_eq!(print.path, "abc.txt");
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
    assert_eq!(print.path, "real.txt");
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
    let unchanged = Ok(VerifiedFile {
        path: path.to_string_lossy().into_owned(),
        rehashed: None,
    });
    assert_eq!(files.verify(&print).await, unchanged);

    // Same size and mtime but a wrong stored digest: not re-hashed, so still no new fingerprint.
    let mut forged = print.clone();
    forged.digest = Digest::from_sha256([7; 32]);
    assert_eq!(files.verify(&forged).await, unchanged);
}

#[tokio::test]
async fn verify_rehashes_when_the_mtime_changed_and_the_content_still_matches() {
    let (_root, models, files) = setup();
    let path = models.join("m.txt");
    fs::write(&path, "abc").unwrap();
    let print = files.fingerprint("m.txt").await.unwrap();
    set_mtime(&path, SystemTime::now() + Duration::from_secs(3600));
    let verified = files.verify(&print).await.unwrap();
    assert_eq!(verified.path, path.to_string_lossy());
    let rehashed = verified
        .rehashed
        .expect("the changed mtime forces a re-hash");
    assert_eq!(rehashed.digest, print.digest);
    assert_eq!(rehashed.path, print.path);
    assert_eq!(rehashed.size_bytes, print.size_bytes);
    assert_ne!(rehashed.modified_millis, print.modified_millis);
    let again = files.verify(&rehashed).await.unwrap();
    assert_eq!(again.rehashed, None);
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

#[tokio::test]
async fn fingerprint_any_hashes_files_outside_the_directory_with_progress() {
    let (root, models, files) = setup();
    let outside = root.path().join("outside.txt");
    fs::write(&outside, "abc").unwrap();
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&calls);
    let progress: Progress = Box::new(move |done, total| seen.lock().unwrap().push((done, total)));
    let print = files
        .fingerprint_any(&outside.to_string_lossy(), Some(progress))
        .await
        .unwrap();
    assert_eq!(print.digest.as_str(), ABC_SHA256);
    // Outside the models directory: the absolute, canonical path.
    assert_eq!(
        print.path,
        fs::canonicalize(&outside).unwrap().to_string_lossy()
    );
    assert_eq!(calls.lock().unwrap().as_slice(), &[(0, 3), (3, 3)]);

    // Inside it: relative, as `fingerprint` records it.
    fs::write(models.join("inside.txt"), "abc").unwrap();
    let inside = files
        .fingerprint_any(&models.join("inside.txt").to_string_lossy(), None)
        .await
        .unwrap();
    assert_eq!(inside.path, "inside.txt");
    assert_eq!(inside, files.fingerprint("inside.txt").await.unwrap());

    let missing = root.path().join("missing.txt");
    assert!(matches!(
        files
            .fingerprint_any(&missing.to_string_lossy(), None)
            .await,
        Err(ModelFileError::Unavailable(_))
    ));
    assert!(matches!(
        files
            .fingerprint_any(&root.path().to_string_lossy(), None)
            .await,
        Err(ModelFileError::PathRejected(_))
    ));
}

#[test]
fn stored_paths_are_relative_inside_the_directory_and_absolute_outside() {
    let (root, models, files) = setup();
    fs::write(models.join("m.txt"), "abc").unwrap();
    let inside = fs::canonicalize(models.join("m.txt")).unwrap();
    assert_eq!(files.stored_path(&inside), "m.txt");
    assert_eq!(files.absolute("m.txt"), models.join("m.txt"));
    let outside = fs::canonicalize(root.path()).unwrap().join("elsewhere.txt");
    assert_eq!(files.stored_path(&outside), outside.to_string_lossy());
    assert_eq!(files.absolute(&outside.to_string_lossy()), outside);
    assert_eq!(files.models_dir(), models.as_path());
}

#[tokio::test]
async fn verify_finds_a_relative_record_in_this_instances_directory() {
    // Two instances with their own models directories share one record (its relative path).
    let (_root, models, files) = setup();
    fs::write(models.join("m.txt"), "abc").unwrap();
    let print = files.fingerprint("m.txt").await.unwrap();
    let (_other_root, other_models, other) = setup();
    let copy = other_models.join("m.txt");
    fs::write(&copy, "abc").unwrap();
    let original = fs::metadata(models.join("m.txt"))
        .unwrap()
        .modified()
        .unwrap();
    set_mtime(&copy, original);
    let verified = other.verify(&print).await.unwrap();
    assert_eq!(verified.path, copy.to_string_lossy());
    assert_eq!(verified.rehashed, None);
}

#[tokio::test]
async fn find_models_lists_model_files_only_sorted() {
    let (_root, models, files) = setup();
    assert_eq!(files.find_models().await.unwrap(), Vec::<String>::new());
    fs::write(models.join("b.gguf"), "x").unwrap();
    fs::write(models.join("a.txt"), "x").unwrap();
    fs::write(models.join("notes.md"), "x").unwrap();
    fs::write(models.join(".hidden.txt"), "x").unwrap();
    fs::write(models.join("noext"), "x").unwrap();
    fs::create_dir_all(models.join("dir.txt")).unwrap();
    let found = files.find_models().await.unwrap();
    assert_eq!(found, ["a.txt", "b.gguf"]);
    for path in &found {
        files.fingerprint(path).await.unwrap();
    }

    let gone = FsModelFiles::new(models.join("does-not-exist"));
    assert!(matches!(
        gone.find_models().await,
        Err(ModelFileError::Unavailable(_))
    ));
}

#[tokio::test]
async fn the_reference_corpus_is_installed_once_into_the_directory() {
    let root = tempfile::tempdir().unwrap();
    // The directory need not exist yet.
    let models = root.path().join("data").join("models");
    let files = FsModelFiles::new(models.clone());
    let path = files.install_reference_corpus().await.unwrap();
    assert_eq!(path, REFERENCE_FILE);
    assert_eq!(
        fs::read_to_string(models.join(REFERENCE_FILE)).unwrap(),
        REFERENCE_CORPUS
    );
    let print = files.fingerprint(&path).await.unwrap();
    assert_eq!(print.path, REFERENCE_FILE);
    assert_eq!(print.size_bytes, REFERENCE_CORPUS.len() as u64);

    fs::write(models.join(REFERENCE_FILE), "the user's own text").unwrap();
    assert_eq!(
        files.install_reference_corpus().await.unwrap(),
        REFERENCE_FILE
    );
    assert_eq!(
        fs::read_to_string(models.join(REFERENCE_FILE)).unwrap(),
        "the user's own text"
    );
}
