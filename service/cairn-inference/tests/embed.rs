//! The real MiniLM model through ONNX Runtime (provisioned by scripts/setup into the
//! workspace's `.models`).

use cairn_core::{Embedder, Error, cosine};
use cairn_inference::{EmbedderConfig, OnnxEmbedder};
use std::path::PathBuf;
use std::sync::Arc;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models")
}

fn config() -> EmbedderConfig {
    EmbedderConfig {
        runtime_library: models().join("onnxruntime/libonnxruntime.so"),
        model_dir: models().join("all-minilm-l6-v2"),
        dimension: 384,
        intra_threads: 1,
        max_batch: 32,
        max_tokens: 256,
    }
}

#[tokio::test]
async fn embeddings_are_deterministic_normalised_and_semantic() {
    let embedder = OnnxEmbedder::load(&config()).expect("load the provisioned model");
    assert_eq!(embedder.dimension(), 384);
    let texts = vec![
        "The user adopted a golden retriever puppy".to_owned(),
        "The user has a new dog".to_owned(),
        "Quarterly tax filing deadlines for corporations".to_owned(),
    ];
    let first = embedder.embed(texts.clone()).await.expect("embed");
    let second = embedder.embed(texts).await.expect("embed again");
    assert_eq!(first.len(), 3);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.len(), 384);
        let norm: f32 = a.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit length, got {norm}");
        assert!(
            a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6),
            "deterministic"
        );
    }
    let related = cosine(&first[0], &first[1]);
    let unrelated = cosine(&first[0], &first[2]);
    assert!(
        related > unrelated + 0.2,
        "related {related} vs unrelated {unrelated}"
    );
}

#[tokio::test]
async fn batch_and_single_calls_agree_and_concurrent_callers_share_the_thread() {
    let embedder = Arc::new(OnnxEmbedder::load(&config()).expect("load"));
    let short = "tea".to_owned();
    let long = "The user spent the whole summer walking the Camino de Santiago with two friends".to_owned();
    let alone = embedder.embed(vec![short.clone()]).await.expect("alone");
    let together = embedder
        .embed(vec![long.clone(), short.clone()])
        .await
        .expect("together");
    assert!(
        cosine(&alone[0], &together[1]) > 0.9999,
        "padding must not change a vector"
    );
    let mut tasks = Vec::new();
    for index in 0..16 {
        let embedder = Arc::clone(&embedder);
        tasks.push(tokio::spawn(async move {
            embedder.embed(vec![format!("message number {index}")]).await
        }));
    }
    for task in tasks {
        let vectors = task.await.expect("task").expect("embed");
        assert_eq!(vectors.len(), 1);
        assert_eq!(vectors[0].len(), 384);
    }
}

#[test]
fn missing_files_name_the_file_and_the_fix() {
    let mut broken = config();
    broken.model_dir = models().join("no-such-model");
    let Err(error) = OnnxEmbedder::load(&broken) else {
        panic!("loading a missing model must fail")
    };
    let message = error.to_string();
    assert!(matches!(error, Error::Unavailable(_)));
    assert!(
        message.contains("no-such-model/model.onnx") && message.contains("scripts/setup"),
        "{message}"
    );
    let mut wrong_width = config();
    wrong_width.dimension = 768;
    let Err(error) = OnnxEmbedder::load(&wrong_width) else {
        panic!("a dimension mismatch must fail")
    };
    assert!(error.to_string().contains("768"), "{error}");
}

/// The cross-encoder here is a plumbing fixture built by
/// tests/fixtures/make_cross_encoder_fixture.py (MiniLM plus a fixed head): its scores
/// carry no relevance, so these tests check the contract, not the ranking.
#[tokio::test]
async fn the_cross_encoder_scores_every_pair_deterministically() {
    use cairn_core::Reranker;
    use cairn_inference::CrossEncoderReranker;
    let reranker = CrossEncoderReranker::load(
        &models().join("onnxruntime/libonnxruntime.so"),
        &models().join("test-cross-encoder"),
        1,
    )
    .expect("run tests/fixtures/make_cross_encoder_fixture.py .models first");
    let documents = vec![
        "The user adopted a golden retriever".to_owned(),
        "Quarterly tax filings are due in April".to_owned(),
        "tea".to_owned(),
    ];
    let first = reranker
        .rerank("which dog does the user have", documents.clone())
        .await
        .expect("rerank");
    let again = reranker
        .rerank("which dog does the user have", documents.clone())
        .await
        .expect("rerank");
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|score| score.is_finite()));
    assert_eq!(first, again, "deterministic");
    assert!(
        first[0] != first[1] && first[1] != first[2],
        "each pair is scored on its own: {first:?}"
    );
    let alone = reranker
        .rerank("which dog does the user have", vec![documents[2].clone()])
        .await
        .expect("one");
    assert!(
        (alone[0] - first[2]).abs() < 1e-4,
        "padding in a batch does not change a pair's score"
    );
    let other_query = reranker
        .rerank("tax deadlines", vec![documents[0].clone()])
        .await
        .expect("rerank");
    assert!(
        (other_query[0] - first[0]).abs() > 1e-6,
        "the query is part of the input"
    );
    let Err(error) = CrossEncoderReranker::load(
        &models().join("onnxruntime/libonnxruntime.so"),
        &models().join("no-cross-encoder"),
        1,
    ) else {
        panic!("a missing model must fail");
    };
    assert!(
        error.to_string().contains("no-cross-encoder/model.onnx"),
        "{error}"
    );
}

#[tokio::test]
async fn late_interaction_prefers_the_document_that_answers() {
    use cairn_core::Reranker;
    let reranker = cairn_inference::LateInteractionReranker::load(&config()).expect("load");
    let scores = reranker
        .rerank(
            "what breed is the user's dog",
            vec![
                "Quarterly tax filings are due in April".to_owned(),
                "The user adopted a golden retriever puppy".to_owned(),
            ],
        )
        .await
        .expect("rerank");
    assert_eq!(scores.len(), 2);
    assert!(scores[1] > scores[0], "{scores:?}");
    assert!(scores.iter().all(|score| (-1.0..=1.0).contains(score)));
}

/// bge-small-en-v1.5 and e5-small-v2 as provisioned from their Maven jars: each read
/// with its descriptor (pooling, query and passage prefixes), so a query and the same
/// text stored embed differently, and a question finds the statement that answers it.
#[tokio::test]
async fn the_other_models_embed_by_their_descriptors() {
    for model in ["bge-small-en-v1.5", "e5-small-v2"] {
        let config = EmbedderConfig {
            model_dir: models().join(model),
            ..config()
        };
        let descriptor = cairn_inference::ModelDescriptor::read(&config.model_dir).expect("descriptor");
        assert!(!descriptor.query_prefix.is_empty(), "{model}: {descriptor:?}");
        let embedder = OnnxEmbedder::load(&config).expect("load the provisioned model");
        assert_eq!(embedder.model_id(), model);
        let stored = embedder
            .embed(vec![
                "The user has a new dog".to_owned(),
                "Quarterly tax filing deadlines for corporations".to_owned(),
            ])
            .await
            .expect("embed");
        let asked = embedder
            .embed_queries(vec![
                "which pet does the user have".to_owned(),
                "The user has a new dog".to_owned(),
            ])
            .await
            .expect("embed queries");
        for vector in stored.iter().chain(&asked) {
            let norm: f32 = vector.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{model}: unit length, got {norm}");
        }
        let (answer, noise) = (cosine(&asked[0], &stored[0]), cosine(&asked[0], &stored[1]));
        assert!(answer > noise + 0.1, "{model}: answer {answer} vs noise {noise}");
        // On the reference scale of the thresholds, unrelated texts read as unrelated
        // (raw, e5 puts them near 0.76), and the order is kept.
        let scale = embedder.similarity_scale();
        assert_ne!(
            scale,
            cairn_core::SimilarityScale::REFERENCE,
            "{model}: its lines are provisioned"
        );
        let (answer, noise) = (scale.queries.apply(answer), scale.queries.apply(noise));
        assert!(
            noise < 0.3 && answer > noise + 0.2,
            "{model}: answer {answer} vs noise {noise}"
        );
        let unrelated = scale.statements(&stored[0], &stored[1]);
        assert!(unrelated < 0.3, "{model}: unrelated statements read {unrelated}");
        assert!(
            cosine(&asked[1], &stored[0]) < 0.9999,
            "{model}: a query is marked as one (its prefix)"
        );
    }

    // Without its descriptor, bge would be pooled by the mean: another vector.
    let bare = tempfile::tempdir().expect("temp dir");
    for file in ["model.onnx", "tokenizer.json"] {
        std::os::unix::fs::symlink(
            models().join("bge-small-en-v1.5").join(file),
            bare.path().join(file),
        )
        .expect("link");
    }
    let text = vec!["The user has a new dog".to_owned()];
    let cls = OnnxEmbedder::load(&EmbedderConfig {
        model_dir: models().join("bge-small-en-v1.5"),
        ..config()
    })
    .expect("load")
    .embed(text.clone())
    .await
    .expect("embed");
    let mean = OnnxEmbedder::load(&EmbedderConfig {
        model_dir: bare.path().to_owned(),
        ..config()
    })
    .expect("load")
    .embed(text)
    .await
    .expect("embed");
    assert!(
        cosine(&cls[0], &mean[0]) < 0.999,
        "the descriptor's pooling is used"
    );
}

/// A descriptor's similarity lines: absent, the reference scale; present, read as
/// written; a line that would reverse or flatten the order of cosines is refused with
/// the file named.
#[test]
fn a_descriptor_reads_its_similarity_lines_and_refuses_bad_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cairn-model.json");
    std::fs::write(&path, r#"{"pooling": "mean"}"#).expect("write");
    let plain = cairn_inference::ModelDescriptor::read(dir.path()).expect("descriptor");
    assert_eq!(plain.similarity, cairn_core::SimilarityScale::REFERENCE);

    std::fs::write(
        &path,
        r#"{"pooling": "mean", "similarity": {"statements": {"offset": -2.5, "slope": 3.5},
            "queries": {"offset": -2.0, "slope": 3.0}}}"#,
    )
    .expect("write");
    let lines = cairn_inference::ModelDescriptor::read(dir.path()).expect("descriptor");
    assert!((lines.similarity.statements.apply(0.8) - 0.3).abs() < 1e-6);
    assert!((lines.similarity.queries.apply(0.8) - 0.4).abs() < 1e-6);
    assert_eq!(lines.similarity.queries.apply(1.0), 1.0, "clamped");

    for bad in [
        r#"{"similarity": {"statements": {"offset": 0.1, "slope": -1.0}}}"#,
        r#"{"similarity": {"queries": {"offset": 0.1}}}"#,
    ] {
        std::fs::write(&path, bad).expect("write");
        let error = cairn_inference::ModelDescriptor::read(dir.path()).expect_err(bad);
        assert!(error.to_string().contains("cairn-model.json"), "{error}");
    }
}
