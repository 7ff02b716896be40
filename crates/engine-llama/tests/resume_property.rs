//! I-6 as a property: for any seed, temperature, budget and cut, a run resumed from the state
//! of any delta ends with exactly the uninterrupted run's text and usage, never past the
//! budget.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests may panic on setup failures.

mod tiny;

use std::num::NonZeroU32;
use std::sync::Arc;

use lmsp_domain::model::{
    Digest, FileFingerprint, ModelFormat, ModelId, ModelRecord, ModelSource, ModelToLoad,
};
use lmsp_domain::ports::{Engine, GenerationItem, GenerationJob, ResumePoint};
use lmsp_domain::task::{Fraction, Input, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_engine_llama::{LlamaEngine, LlamaSettings};
use proptest::prelude::*;

async fn run(engine: &LlamaEngine, job: GenerationJob) -> (Vec<(String, Vec<u8>)>, Usage) {
    let mut generation = engine.generate(job).await.unwrap();
    let mut deltas = Vec::new();
    loop {
        match generation.next_item().await.unwrap() {
            Some(GenerationItem::Delta { text, state }) => deltas.push((text, state)),
            Some(GenerationItem::Finished { usage }) => return (deltas, usage),
            Some(other) => panic!("a plain run sends no {other:?}"),
            None => panic!("ended without finishing"),
        }
    }
}

fn text(deltas: &[(String, Vec<u8>)]) -> String {
    deltas.iter().map(|(text, _)| text.as_str()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn a_resumed_run_ends_as_the_uninterrupted_one(
        seed in any::<u64>(),
        temperature in prop_oneof![Just(None), Just(Some(0.0)), (1u32..=20).prop_map(|t| Some(f64::from(t) / 10.0))],
        top_p in prop_oneof![Just(None), (5u32..=10).prop_map(|p| Some(f64::from(p) / 10.0))],
        max in 1u32..48,
        cut in 0.0f64..1.0,
        prompt in "[a-z0-9 !#]{1,12}",
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        tiny::write(&path, None);
        let model = ModelToLoad {
            record: ModelRecord {
                id: ModelId::parse("tiny").unwrap(),
                source: ModelSource::File {
                    format: ModelFormat::Gguf,
                    file: FileFingerprint {
                        path: "tiny.gguf".into(),
                        size_bytes: 0,
                        modified_millis: 0,
                        digest: Digest::from_sha256([1; 32]),
                    },
                },
                created_at: Timestamp::from_millis(0),
            },
            path: Some(path.to_string_lossy().into_owned()),
        };
        let spec = Arc::new(TaskSpec {
            input: Input::Text(prompt),
            instructions: None,
            max_output_tokens: max,
            seed,
            temperature: temperature.and_then(Fraction::new),
            top_p: top_p.and_then(Fraction::new),
            previous_response_id: None,
           controls: Default::default(),
        });
        let job = |resume| GenerationJob { model: model.clone(), spec: Arc::clone(&spec), resume };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let engine = LlamaEngine::new(LlamaSettings {
            threads: NonZeroU32::new(1),
            ..LlamaSettings::default()
        })
        .unwrap();
        let (full, usage) = runtime.block_on(run(&engine, job(None)));
        prop_assert!(usage.output_tokens <= u64::from(max));
        if full.is_empty() {
            return Ok(());
        }
        // The state of delta k (1-based), after `cut` of the run.
        let k = 1 + ((full.len() - 1) as f64 * cut) as usize;
        let so_far = text(&full[..k]);
        let resume = ResumePoint { state: full[k - 1].1.clone(), text_so_far: so_far.clone() };
        let (rest, resumed_usage) = runtime.block_on(run(&engine, job(Some(resume))));
        prop_assert_eq!(format!("{so_far}{}", text(&rest)), text(&full));
        prop_assert_eq!(&rest[..], &full[k..]);
        prop_assert_eq!(resumed_usage, usage);
    }
}
