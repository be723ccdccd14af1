//! How one embedding model's cosines compare with all-MiniLM-L6-v2's, to calibrate the
//! thresholds by meaning (the consolidation gates, the slots, the answer's known-or-not)
//! for another model.
//!
//! Two kinds of pairs, as the service compares them: statements against statements
//! (every pair of the fact statements the scenario files script, "The user …"), and
//! questions against memories (every LoCoMo question against every turn of its
//! conversation). For each kind and model it prints the cosine at a ladder of quantiles,
//! then fits, on the development half only, the line that carries the model's quantiles
//! onto MiniLM's over the upper half of the distribution (where every threshold lies),
//! and shows how well that line carries the held-out half.
//!
//! `cargo run --release -p cairn-evals --bin cosines -- e5-small-v2 [.models]`
//!
//! With `--slots TEXT...` after the model, it prints instead, for each statement, the
//! attributes of the slots by meaning it is closest to under each model (on the
//! reference scale), which is what decides whether a change replaces a value.

#[allow(dead_code)] // the scopes of the harness are not needed here
mod harness;

use anyhow::Context;
use cairn_core::{Embedder, cosine};
use cairn_inference::OnnxEmbedder;
use serde_json::Value;
use std::path::{Path, PathBuf};

const BASE: &str = "all-minilm-l6-v2";
const DEVELOPMENT: &[&str] = &[
    "scenarios.json",
    "conversations-dev.json",
    "conversations-dev2.json",
    "conversations-dev3.json",
    "conversations-dev4.json",
    "conversations-dev5.json",
    "atomic-dev.json",
];
const HELD_OUT: &[&str] = &[
    "holdout.json",
    "conversations-heldout.json",
    "atomic-heldout.json",
];
const LOCOMO: &str = "../shared/data/locomo/locomo_dev5.json";
/// Quantiles the line is fitted over: the upper half, where the thresholds are.
const LADDER: &[f64] = &[0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999];

fn main() -> anyhow::Result<()> {
    let mut arguments = std::env::args().skip(1);
    let model = arguments
        .next()
        .context("name the model to compare, e.g. e5-small-v2")?;
    let rest: Vec<String> = arguments.collect();
    if let Some(at) = rest.iter().position(|argument| argument == "--slots") {
        let models = PathBuf::from(
            rest.get(..at)
                .and_then(|before| before.first())
                .map_or(".models", String::as_str),
        );
        return harness::runtime()?.block_on(slots(&model, &models, &rest[at + 1..]));
    }
    let models = PathBuf::from(rest.first().map_or(".models", String::as_str));
    harness::runtime()?.block_on(run(&model, &models))
}

async fn slots(model: &str, models: &Path, texts: &[String]) -> anyhow::Result<()> {
    for name in [BASE, model] {
        let meaning = cairn_offline::SlotMeaning::new(std::sync::Arc::new(load(models, name)?));
        println!("{name}:");
        for text in texts {
            let closest = meaning.closeness(text).await?;
            let shown: Vec<String> = closest
                .iter()
                .take(3)
                .map(|(slot, cosine)| format!("{slot} {cosine:.3}"))
                .collect();
            println!("  {text}: {}", shown.join(", "));
        }
    }
    Ok(())
}

fn load(models: &Path, name: &str) -> anyhow::Result<OnnxEmbedder> {
    let mut config = harness::embedder_config(models);
    config.model_dir = models.join(name);
    Ok(OnnxEmbedder::load(&config)?)
}

/// Every distinct "The user …" statement in the scenario files named.
fn statements(files: &[&str]) -> anyhow::Result<Vec<String>> {
    fn walk(value: &Value, into: &mut Vec<String>) {
        match value {
            Value::String(text) if text.starts_with("The user") => into.push(text.clone()),
            Value::Array(items) => items.iter().for_each(|item| walk(item, into)),
            Value::Object(fields) => fields.values().for_each(|item| walk(item, into)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for file in files {
        let path = Path::new("evals/scenarios").join(file);
        let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
        walk(&serde_json::from_str(&text)?, &mut found);
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// Per LoCoMo conversation: its questions and its turns ("speaker: text").
fn locomo() -> anyhow::Result<Vec<(Vec<String>, Vec<String>)>> {
    let samples: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(LOCOMO).context(LOCOMO)?)?;
    Ok(samples
        .iter()
        .map(|sample| {
            let questions = sample["qa"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|qa| qa["question"].as_str().map(str::to_owned))
                .collect();
            let turns = sample["conversation"]
                .as_object()
                .into_iter()
                .flat_map(|fields| fields.values())
                .filter_map(Value::as_array)
                .flatten()
                .filter_map(|turn| {
                    Some(format!(
                        "{}: {}",
                        turn["speaker"].as_str()?,
                        turn["text"].as_str()?
                    ))
                })
                .collect();
            (questions, turns)
        })
        .collect())
}

async fn statement_cosines(model: &OnnxEmbedder, texts: &[String]) -> anyhow::Result<Vec<f32>> {
    let vectors = model.embed(texts.to_vec()).await?;
    let mut cosines = Vec::new();
    for (index, left) in vectors.iter().enumerate() {
        for right in &vectors[index + 1..] {
            cosines.push(cosine(left, right));
        }
    }
    Ok(sorted(cosines))
}

async fn question_cosines(
    model: &OnnxEmbedder,
    conversations: &[(Vec<String>, Vec<String>)],
) -> anyhow::Result<Vec<f32>> {
    let mut cosines = Vec::new();
    for (questions, turns) in conversations {
        let queries = model.embed_queries(questions.clone()).await?;
        let memories = model.embed(turns.clone()).await?;
        for query in &queries {
            cosines.extend(memories.iter().map(|memory| cosine(query, memory)));
        }
    }
    Ok(sorted(cosines))
}

fn sorted(mut cosines: Vec<f32>) -> Vec<f32> {
    cosines.sort_by(f32::total_cmp);
    cosines
}

fn quantile(sorted: &[f32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let position = (q * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[position.min(sorted.len() - 1)])
}

/// Least squares `base ≈ offset + slope · other` over the ladder's quantiles.
fn fit(base: &[f32], other: &[f32]) -> (f64, f64) {
    let points: Vec<(f64, f64)> = LADDER
        .iter()
        .map(|&q| (quantile(other, q), quantile(base, q)))
        .collect();
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let slope = covariance / variance;
    (mean_y - slope * mean_x, slope)
}

fn report(kind: &str, half: &str, base: &[f32], other: &[f32], line: (f64, f64), model: &str) {
    println!();
    println!("{kind}, {half} ({} pairs):", base.len());
    println!();
    println!("| quantile | {BASE} | {model} | {model} carried by the line |");
    println!("|---|---|---|---|");
    let mut error = 0.0f64;
    for &q in LADDER {
        let carried = line.0 + line.1 * quantile(other, q);
        error = error.max((carried - quantile(base, q)).abs());
        println!(
            "| {q} | {:.3} | {:.3} | {carried:.3} |",
            quantile(base, q),
            quantile(other, q)
        );
    }
    println!();
    println!("largest gap after the line: {error:.3}");
}

async fn run(model: &str, models: &Path) -> anyhow::Result<()> {
    let base = load(models, BASE)?;
    let other = load(models, model)?;
    let development = statements(DEVELOPMENT)?;
    let held_out = statements(HELD_OUT)?;
    let conversations = locomo()?;
    let (tuning, checking) = conversations.split_at(3.min(conversations.len()));

    let statements_dev = (
        statement_cosines(&base, &development).await?,
        statement_cosines(&other, &development).await?,
    );
    let questions_dev = (
        question_cosines(&base, tuning).await?,
        question_cosines(&other, tuning).await?,
    );
    let statement_line = fit(&statements_dev.0, &statements_dev.1);
    let question_line = fit(&questions_dev.0, &questions_dev.1);
    println!(
        "statements against statements: {BASE} ≈ {:.4} + {:.4} × {model}",
        statement_line.0, statement_line.1
    );
    println!(
        "questions against memories: {BASE} ≈ {:.4} + {:.4} × {model}",
        question_line.0, question_line.1
    );
    report(
        "statements",
        "development",
        &statements_dev.0,
        &statements_dev.1,
        statement_line,
        model,
    );
    let statements_held = (
        statement_cosines(&base, &held_out).await?,
        statement_cosines(&other, &held_out).await?,
    );
    report(
        "statements",
        "held out",
        &statements_held.0,
        &statements_held.1,
        statement_line,
        model,
    );
    report(
        "questions",
        "conversations 1-3",
        &questions_dev.0,
        &questions_dev.1,
        question_line,
        model,
    );
    let questions_held = (
        question_cosines(&base, checking).await?,
        question_cosines(&other, checking).await?,
    );
    report(
        "questions",
        "conversations 4-5",
        &questions_held.0,
        &questions_held.1,
        question_line,
        model,
    );
    Ok(())
}
