//! Local sentence embeddings through ONNX Runtime, loaded dynamically from a library
//! file (never downloaded at build or run time).
//!
//! Inference runs on one dedicated thread, off the async executor. Requests queue on a
//! channel; the thread takes everything waiting (up to a batch limit) and embeds it in
//! one run, so concurrent callers share batches.
//!
//! [`llm`] holds the remote LLM providers consolidation uses when one is configured.

pub mod llm;

use async_trait::async_trait;
use cairn_core::{CosineLine, Embedder, Error, Result, SimilarityScale};
use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// How a model makes one vector of its token vectors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the real tokens' vectors (sentence-transformers models).
    #[default]
    Mean,
    /// The first token's vector (`[CLS]`; the BGE models).
    Cls,
}

/// What a model needs beyond its weights, read from `cairn-model.json` in its
/// directory (written by provisioning); a directory without one is a mean-pooled model
/// that takes texts as they are.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelDescriptor {
    pub pooling: Pooling,
    /// Put before every search query (an instruction, `query: `).
    pub query_prefix: String,
    /// Put before every text that is stored and searched for (`passage: `).
    pub passage_prefix: String,
    /// How the model's cosines read on the reference scale of the thresholds by meaning
    /// (`"similarity": {"statements": {"offset": …, "slope": …}, "queries": {…}}`);
    /// the reference scale itself when absent.
    pub similarity: SimilarityScale,
}

impl Default for ModelDescriptor {
    fn default() -> Self {
        ModelDescriptor {
            pooling: Pooling::default(),
            query_prefix: String::new(),
            passage_prefix: String::new(),
            similarity: SimilarityScale::REFERENCE,
        }
    }
}

impl ModelDescriptor {
    /// The descriptor of the model in `model_dir`.
    pub fn read(model_dir: &Path) -> Result<Self> {
        let path = model_dir.join("cairn-model.json");
        if !path.exists() {
            return Ok(ModelDescriptor::default());
        }
        let bad = |what: String| Error::Unavailable(format!("{}: {what}", path.display()));
        let text = std::fs::read_to_string(&path).map_err(|error| bad(error.to_string()))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|error| bad(error.to_string()))?;
        let pooling = match value["pooling"].as_str().unwrap_or("mean") {
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            other => return Err(bad(format!("unknown pooling {other:?} (mean or cls)"))),
        };
        let text_of = |field: &str| value[field].as_str().unwrap_or_default().to_owned();
        let line_of = |kind: &str| -> Result<CosineLine> {
            let line = &value["similarity"][kind];
            if line.is_null() {
                return Ok(CosineLine::IDENTITY);
            }
            match (line["offset"].as_f64(), line["slope"].as_f64()) {
                (Some(offset), Some(slope)) if slope > 0.0 && offset.is_finite() && slope.is_finite() => {
                    Ok(CosineLine {
                        offset: offset as f32,
                        slope: slope as f32,
                    })
                }
                _ => Err(bad(format!(
                    "similarity.{kind} needs a finite offset and a positive slope"
                ))),
            }
        };
        Ok(ModelDescriptor {
            pooling,
            query_prefix: text_of("query_prefix"),
            passage_prefix: text_of("passage_prefix"),
            similarity: SimilarityScale {
                statements: line_of("statements")?,
                queries: line_of("queries")?,
            },
        })
    }
}

/// Where the model files are and how to run them.
#[derive(Clone, Debug)]
pub struct EmbedderConfig {
    /// The ONNX Runtime shared library (`libonnxruntime.so`).
    pub runtime_library: PathBuf,
    /// A directory holding `model.onnx` and `tokenizer.json`.
    pub model_dir: PathBuf,
    /// The vector length the model produces.
    pub dimension: usize,
    /// Threads ONNX Runtime uses inside one run.
    pub intra_threads: usize,
    /// Most texts embedded in one run.
    pub max_batch: usize,
    /// Longest input in tokens; longer texts are truncated.
    pub max_tokens: usize,
}

/// The model whose cosines the thresholds by meaning were written against (the
/// reference scale of [`cairn_core::SimilarityScale`]), provisioned beside any other.
pub const REFERENCE_MODEL: &str = "all-minilm-l6-v2";

impl EmbedderConfig {
    /// The reference model beside this one (same runtime, directory `REFERENCE_MODEL`
    /// next to this model's), or `None` when this is the reference model.
    pub fn reference(&self) -> Option<EmbedderConfig> {
        if self
            .model_dir
            .file_name()
            .is_some_and(|name| name == REFERENCE_MODEL)
        {
            return None;
        }
        let parent = self.model_dir.parent()?;
        Some(EmbedderConfig {
            model_dir: parent.join(REFERENCE_MODEL),
            ..self.clone()
        })
    }
}

const PROVISIONING_HINT: &str = "run scripts/setup to provision the model files";

fn missing(path: &Path, hint: &str) -> Error {
    Error::Unavailable(format!("{} is missing; {hint}", path.display()))
}

/// ONNX Runtime allows one environment per process; every embedder shares it.
static RUNTIME: OnceLock<std::result::Result<Environment, String>> = OnceLock::new();

fn init_runtime(library: &Path) -> Result<&'static Environment> {
    if !library.exists() {
        return Err(missing(library, PROVISIONING_HINT));
    }
    let outcome = RUNTIME.get_or_init(|| {
        ort::init_from(library)
            .map_err(|error| format!("cannot load ONNX Runtime from {}: {error}", library.display()))?
            .with_name("cairn")
            .build()
            .map_err(|error| format!("cannot start ONNX Runtime: {error}"))
    });
    match outcome {
        Ok(environment) => Ok(environment),
        Err(message) => Err(Error::Unavailable(message.clone())),
    }
}

struct Job {
    texts: Vec<String>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>>>,
}

/// A sentence-embedding model (pooled as its descriptor says, L2-normalised) run
/// locally.
pub struct OnnxEmbedder {
    sender: mpsc::Sender<Job>,
    dimension: usize,
    model_id: String,
    descriptor: ModelDescriptor,
}

struct Model {
    session: Session,
    tokenizer: Tokenizer,
    wants_token_type_ids: bool,
    pooling: Pooling,
}

impl OnnxEmbedder {
    /// Loads the runtime, the model and the tokenizer, and starts the inference thread.
    /// Missing files produce an error naming the file and the provisioning command.
    pub fn load(config: &EmbedderConfig) -> Result<Self> {
        let (session, tokenizer) = load_model(
            &config.runtime_library,
            &config.model_dir,
            config.max_tokens,
            config.intra_threads,
            PROVISIONING_HINT,
        )?;
        let model_path = config.model_dir.join("model.onnx");
        let descriptor = ModelDescriptor::read(&config.model_dir)?;
        let wants_token_type_ids = session
            .inputs()
            .iter()
            .any(|input| input.name() == "token_type_ids");
        let mut model = Model {
            session,
            tokenizer,
            wants_token_type_ids,
            pooling: descriptor.pooling,
        };
        // Fail now, not on the first request, if the model's width is not the configured one.
        let probe = model.embed(&["dimension probe".to_owned()])?;
        if probe.first().map(Vec::len) != Some(config.dimension) {
            return Err(Error::Unavailable(format!(
                "{} produces {}-dimensional vectors but the configured dimension is {}",
                model_path.display(),
                probe.first().map(Vec::len).unwrap_or(0),
                config.dimension
            )));
        }
        let (sender, receiver) = mpsc::channel::<Job>();
        let max_batch = config.max_batch.max(1);
        std::thread::Builder::new()
            .name("cairn-embedder".into())
            .spawn(move || serve(model, receiver, max_batch))
            .map_err(|error| Error::Unavailable(format!("cannot start the inference thread: {error}")))?;
        let model_id = config
            .model_dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| "embedding-model".into());
        Ok(OnnxEmbedder {
            sender,
            dimension: config.dimension,
            model_id,
            descriptor,
        })
    }
}

/// Loads `model.onnx` and `tokenizer.json` from a directory; a missing file is an error
/// naming it, followed by `hint`.
fn load_model(
    runtime_library: &Path,
    model_dir: &Path,
    max_tokens: usize,
    intra_threads: usize,
    hint: &str,
) -> Result<(Session, Tokenizer)> {
    let environment = init_runtime(runtime_library)?;
    let model_path = model_dir.join("model.onnx");
    let tokenizer_path = model_dir.join("tokenizer.json");
    for path in [&model_path, &tokenizer_path] {
        if !path.exists() {
            return Err(missing(path, hint));
        }
    }
    let tokenizer = load_tokenizer(&tokenizer_path, max_tokens)?;
    let session = load_session(environment, &model_path, intra_threads)?;
    Ok((session, tokenizer))
}

/// A session and its tokenizer shared by callers, run on the blocking pool one call at
/// a time, never on the async executor.
struct BlockingModel {
    inner: Arc<Mutex<(Session, Tokenizer)>>,
}

impl BlockingModel {
    fn new(session: Session, tokenizer: Tokenizer) -> Self {
        BlockingModel {
            inner: Arc::new(Mutex::new((session, tokenizer))),
        }
    }

    async fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Session, &Tokenizer) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut guard = inner
                .lock()
                .map_err(|_| Error::Unavailable("a model lock is poisoned".into()))?;
            let (session, tokenizer) = &mut *guard;
            work(session, tokenizer)
        })
        .await
        .map_err(|error| Error::Unavailable(format!("inference task: {error}")))?
    }
}

/// Loads a tokenizer padded to the batch's longest input and truncated at `max_tokens`
/// (shipped tokenizers often pad every input to a fixed length instead).
fn load_tokenizer(path: &Path, max_tokens: usize) -> Result<Tokenizer> {
    let mut tokenizer = Tokenizer::from_file(path)
        .map_err(|error| Error::Unavailable(format!("{}: {error}", path.display())))?;
    tokenizer.with_padding(Some(PaddingParams {
        strategy: PaddingStrategy::BatchLongest,
        ..PaddingParams::default()
    }));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_tokens,
            ..TruncationParams::default()
        }))
        .map_err(|error| Error::Unavailable(format!("tokenizer truncation: {error}")))?;
    Ok(tokenizer)
}

fn load_session(environment: &Environment, path: &Path, intra_threads: usize) -> Result<Session> {
    let options_error =
        |error: &dyn std::fmt::Display| Error::Unavailable(format!("ONNX session options: {error}"));
    Session::builder(environment)
        .map_err(|error| options_error(&error))?
        .with_optimization_level(GraphOptimizationLevel::Level3)
        .map_err(|error| options_error(&error))?
        .with_intra_threads(intra_threads.max(1))
        .map_err(|error| options_error(&error))?
        .with_intra_op_spinning(false)
        .map_err(|error| options_error(&error))?
        .commit_from_file(path)
        .map_err(|error| Error::Unavailable(format!("{}: {error}", path.display())))
}

/// Token ids, attention mask and type ids of a batch as `[batch, length]` i64 arrays.
struct Batch {
    rows: usize,
    length: usize,
    ids: Vec<i64>,
    mask: Vec<i64>,
    types: Vec<i64>,
}

impl Batch {
    fn of(encodings: &[tokenizers::Encoding]) -> Batch {
        let rows = encodings.len();
        let length = encodings
            .iter()
            .map(|encoding| encoding.get_ids().len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut ids = vec![0i64; rows * length];
        let mut mask = vec![0i64; rows * length];
        let mut types = vec![0i64; rows * length];
        for (row, encoding) in encodings.iter().enumerate() {
            for (column, ((id, attention), kind)) in encoding
                .get_ids()
                .iter()
                .zip(encoding.get_attention_mask())
                .zip(encoding.get_type_ids())
                .enumerate()
            {
                ids[row * length + column] = i64::from(*id);
                mask[row * length + column] = i64::from(*attention);
                types[row * length + column] = i64::from(*kind);
            }
        }
        Batch {
            rows,
            length,
            ids,
            mask,
            types,
        }
    }
}

/// The inference loop: block for one job, gather whatever else is waiting, run once.
fn serve(mut model: Model, receiver: mpsc::Receiver<Job>, max_batch: usize) {
    while let Ok(first) = receiver.recv() {
        let mut jobs = vec![first];
        let mut queued: usize = jobs[0].texts.len();
        while queued < max_batch {
            match receiver.try_recv() {
                Ok(job) => {
                    queued += job.texts.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let texts: Vec<String> = jobs.iter().flat_map(|job| job.texts.iter().cloned()).collect();
        let mut outcome = texts
            .chunks(max_batch)
            .map(|chunk| model.embed(chunk))
            .collect::<Result<Vec<_>>>()
            .map(|batches| batches.into_iter().flatten().collect::<Vec<_>>());
        for job in jobs {
            let reply = match &mut outcome {
                Ok(vectors) => Ok(vectors.drain(..job.texts.len()).collect()),
                Err(error) => Err(Error::Unavailable(error.to_string())),
            };
            // A caller that stopped waiting is not an error of the embedder.
            let _ = job.reply.send(reply);
        }
    }
}

impl Model {
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let failure =
            |what: &str, error: &dyn std::fmt::Display| Error::Unavailable(format!("{what}: {error}"));
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|error| failure("tokenizing", &error))?;
        let Batch {
            rows: batch,
            length,
            ids,
            mask,
            types,
        } = Batch::of(&encodings);
        let shape = [batch, length];
        let tensor = |values: Vec<i64>| {
            Tensor::from_array((shape, values)).map_err(|error| failure("input tensor", &error))
        };
        let mut inputs = ort::inputs![
            "input_ids" => tensor(ids)?,
            "attention_mask" => tensor(mask.clone())?,
        ];
        if self.wants_token_type_ids {
            inputs.push(("token_type_ids".into(), tensor(types)?.into()));
        }
        let outputs = self
            .session
            .run(inputs)
            .map_err(|error| failure("inference", &error))?;
        let (output_shape, hidden) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|error| failure("reading the output", &error))?;
        let width = usize::try_from(*output_shape.last().unwrap_or(&0)).unwrap_or(0);
        if output_shape.len() != 3 || width == 0 {
            return Err(Error::Unavailable(format!(
                "the model's first output has shape {output_shape:?}; expected [batch, tokens, hidden]"
            )));
        }
        let tokens = hidden.len() / (batch * width);
        let mut vectors = Vec::with_capacity(batch);
        let pooled_tokens = match self.pooling {
            Pooling::Mean => tokens.min(length),
            Pooling::Cls => 1,
        };
        for row in 0..batch {
            // Mean pooling over real tokens (the mean's divisor cancels in
            // normalisation), or the first token alone.
            let mut pooled = vec![0f32; width];
            for token in 0..pooled_tokens {
                if mask[row * length + token] == 0 {
                    continue;
                }
                let offset = (row * tokens + token) * width;
                for (sum, value) in pooled.iter_mut().zip(&hidden[offset..offset + width]) {
                    *sum += value;
                }
            }
            let norm = pooled
                .iter()
                .map(|value| value * value)
                .sum::<f32>()
                .sqrt()
                .max(1e-12);
            vectors.push(pooled.iter().map(|value| value / norm).collect());
        }
        Ok(vectors)
    }
}

#[async_trait]
impl Embedder for OnnxEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn similarity_scale(&self) -> SimilarityScale {
        self.descriptor.similarity
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        self.run(prefixed(&self.descriptor.passage_prefix, texts)).await
    }

    async fn embed_queries(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        self.run(prefixed(&self.descriptor.query_prefix, texts)).await
    }
}

/// `texts`, each after `prefix`.
fn prefixed(prefix: &str, texts: Vec<String>) -> Vec<String> {
    if prefix.is_empty() {
        return texts;
    }
    texts.into_iter().map(|text| format!("{prefix}{text}")).collect()
}

impl OnnxEmbedder {
    /// Embeds `texts` as they are, on the inference thread.
    async fn run(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.sender
            .send(Job { texts, reply })
            .map_err(|_| Error::Unavailable("the inference thread has stopped".into()))?;
        answer
            .await
            .map_err(|_| Error::Unavailable("the inference thread dropped a request".into()))?
    }
}

/// A local cross-encoder reranker: a sequence-classification ONNX model scoring
/// (query, document) pairs, loaded from a directory with `model.onnx` and
/// `tokenizer.json`. Inference runs on the blocking pool, never on the executor.
pub struct CrossEncoderReranker {
    model: BlockingModel,
}

impl CrossEncoderReranker {
    pub fn load(runtime_library: &Path, model_dir: &Path, intra_threads: usize) -> Result<Self> {
        let hint = "point CAIRN_RERANK_MODEL_DIR at a cross-encoder directory";
        let (session, tokenizer) = load_model(runtime_library, model_dir, 512, intra_threads, hint)?;
        Ok(CrossEncoderReranker {
            model: BlockingModel::new(session, tokenizer),
        })
    }
}

fn score_pairs(
    session: &mut Session,
    tokenizer: &Tokenizer,
    query: &str,
    documents: Vec<String>,
) -> Result<Vec<f64>> {
    let failure = |what: &str, error: &dyn std::fmt::Display| Error::Unavailable(format!("{what}: {error}"));
    let pairs: Vec<(String, String)> = documents
        .into_iter()
        .map(|document| (query.to_owned(), document))
        .collect();
    let encodings = tokenizer
        .encode_batch(pairs, true)
        .map_err(|error| failure("tokenizing", &error))?;
    let Batch {
        rows,
        length,
        ids,
        mask,
        types,
    } = Batch::of(&encodings);
    let tensor = |values: Vec<i64>| {
        Tensor::from_array(([rows, length], values)).map_err(|error| failure("input tensor", &error))
    };
    let inputs = ort::inputs![
        "input_ids" => tensor(ids)?,
        "attention_mask" => tensor(mask)?,
        "token_type_ids" => tensor(types)?,
    ];
    let outputs = session
        .run(inputs)
        .map_err(|error| failure("inference", &error))?;
    let (shape, logits) = outputs[0]
        .try_extract_tensor::<f32>()
        .map_err(|error| failure("reading logits", &error))?;
    let classes = usize::try_from(*shape.last().unwrap_or(&1)).unwrap_or(1).max(1);
    if logits.len() != rows * classes {
        return Err(Error::Unavailable(format!(
            "the cross-encoder's logits have shape {shape:?}"
        )));
    }
    // The last class is the "relevant" one (a single logit, or [irrelevant, relevant]).
    Ok((0..rows)
        .map(|row| f64::from(logits[row * classes + classes - 1]))
        .collect())
}

#[async_trait]
impl cairn_core::Reranker for CrossEncoderReranker {
    fn name(&self) -> &str {
        "cross-encoder"
    }

    async fn rerank(&self, query: &str, documents: Vec<String>) -> Result<Vec<f64>> {
        let query = query.to_owned();
        self.model
            .run(move |session, tokenizer| score_pairs(session, tokenizer, &query, documents))
            .await
    }
}

/// An offline reranker that needs no extra download: late interaction (MaxSim) over the
/// embedding model's token vectors. Each query token is matched with its most similar
/// document token; the score is the mean of those similarities.
pub struct LateInteractionReranker {
    model: BlockingModel,
}

impl LateInteractionReranker {
    pub fn load(config: &EmbedderConfig) -> Result<Self> {
        let (session, tokenizer) = load_model(
            &config.runtime_library,
            &config.model_dir,
            config.max_tokens,
            config.intra_threads,
            PROVISIONING_HINT,
        )?;
        Ok(LateInteractionReranker {
            model: BlockingModel::new(session, tokenizer),
        })
    }
}

/// Late-interaction score: each query token's best cosine against the document's tokens,
/// averaged over the query tokens (0 when either side has none).
fn max_similarity(query_tokens: &[Vec<f32>], document_tokens: &[Vec<f32>]) -> f64 {
    if query_tokens.is_empty() || document_tokens.is_empty() {
        return 0.0;
    }
    let total: f32 = query_tokens
        .iter()
        .map(|query| {
            document_tokens
                .iter()
                .map(|document| cairn_core::cosine(query, document))
                .fold(f32::MIN, f32::max)
        })
        .sum();
    f64::from(total / query_tokens.len() as f32)
}

/// Unit-length vectors of each real token (special tokens at both ends left out).
fn token_vectors(
    session: &mut Session,
    tokenizer: &Tokenizer,
    texts: Vec<String>,
) -> Result<Vec<Vec<Vec<f32>>>> {
    let failure = |what: &str, error: &dyn std::fmt::Display| Error::Unavailable(format!("{what}: {error}"));
    let encodings = tokenizer
        .encode_batch(texts, true)
        .map_err(|error| failure("tokenizing", &error))?;
    let Batch {
        rows,
        length,
        ids,
        mask,
        types,
    } = Batch::of(&encodings);
    let wants_types = session
        .inputs()
        .iter()
        .any(|input| input.name() == "token_type_ids");
    let tensor = |values: Vec<i64>| {
        Tensor::from_array(([rows, length], values)).map_err(|error| failure("input tensor", &error))
    };
    let mut inputs = ort::inputs!["input_ids" => tensor(ids)?, "attention_mask" => tensor(mask.clone())?];
    if wants_types {
        inputs.push(("token_type_ids".into(), tensor(types)?.into()));
    }
    let outputs = session
        .run(inputs)
        .map_err(|error| failure("inference", &error))?;
    let (shape, hidden) = outputs[0]
        .try_extract_tensor::<f32>()
        .map_err(|error| failure("reading the output", &error))?;
    let width = usize::try_from(*shape.last().unwrap_or(&0)).unwrap_or(0).max(1);
    let tokens = hidden.len() / (rows * width);
    Ok((0..rows)
        .map(|row| {
            let real = (0..tokens.min(length))
                .filter(|token| mask[row * length + token] != 0)
                .count();
            (1..real.saturating_sub(1))
                .map(|token| {
                    let offset = (row * tokens + token) * width;
                    let vector = &hidden[offset..offset + width];
                    let norm = vector
                        .iter()
                        .map(|value| value * value)
                        .sum::<f32>()
                        .sqrt()
                        .max(1e-12);
                    vector.iter().map(|value| value / norm).collect()
                })
                .collect()
        })
        .collect())
}

#[async_trait]
impl cairn_core::Reranker for LateInteractionReranker {
    fn name(&self) -> &str {
        "late-interaction"
    }

    async fn rerank(&self, query: &str, documents: Vec<String>) -> Result<Vec<f64>> {
        let query = query.to_owned();
        self.model
            .run(move |session, tokenizer| {
                let query_tokens = token_vectors(session, tokenizer, vec![query])?
                    .pop()
                    .unwrap_or_default();
                let document_tokens = token_vectors(session, tokenizer, documents)?;
                Ok(document_tokens
                    .iter()
                    .map(|tokens| max_similarity(&query_tokens, tokens))
                    .collect())
            })
            .await
    }
}
