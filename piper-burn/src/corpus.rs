//! Training data: a seeded stochastic grammar whose entropy rate is known (so the best achievable loss
//! is known), or any UTF-8 text as bytes.
//!
//! The grammar is a second-order Markov chain over `alphabet` symbols: every pair of previous symbols
//! allows `branching` next symbols with random probabilities. Its entropy rate, the lowest cross-entropy
//! any model can reach, is `Σ_(a,b) π(a,b) · H(next | a, b)` with π the stationary distribution of the
//! pair chain (power iteration).

/// A deterministic random generator (SplitMix64), so a seed gives the same data everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Data that cannot be read, or a saved position that belongs to other data.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DataError {
    /// A data flag that cannot work: the flag, then why and what would.
    #[error("{flag} {why}")]
    Flag { flag: &'static str, why: String },
    #[error("the data position is not an object")]
    NotAnObject,
    #[error("the checkpoint was trained on `{saved}`, this run reads `{reads}`: pass the same data flags")]
    OtherData { saved: String, reads: String },
    #[error("the data position has no generator state")]
    NoGeneratorState,
    #[error("the data position's grammar state does not fit this grammar")]
    GrammarState,
}

/// Where training batches come from.
pub trait Corpus {
    /// Token ids of `batch` sequences of `seq_len` tokens, row-major.
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64>;
    /// Size of the token space the data uses (ids are below it).
    fn vocab_size(&self) -> usize;
    /// The lowest achievable cross-entropy (nats per token), if known.
    fn best_loss(&self) -> Option<f64>;
    fn describe(&self) -> String;
    /// Where the stream stands (its generator state and what it draws from), for a checkpoint.
    fn position(&self) -> serde_json::Value;
    /// Continues the stream from a [`Corpus::position`] of the same data; the error says what differs.
    fn restore_position(&mut self, position: &serde_json::Value) -> Result<(), DataError>;
}

/// Reads `{"describe": …, "rng": …, extra…}` back: the data must be the one described.
fn check_position<'a>(
    position: &'a serde_json::Value,
    describe: &str,
) -> Result<(&'a serde_json::Map<String, serde_json::Value>, u64), DataError> {
    let obj = position.as_object().ok_or(DataError::NotAnObject)?;
    let saved = obj.get("describe").and_then(|d| d.as_str()).unwrap_or("?");
    if saved != describe {
        return Err(DataError::OtherData { saved: saved.into(), reads: describe.into() });
    }
    let rng = obj.get("rng").and_then(|r| r.as_u64()).ok_or(DataError::NoGeneratorState)?;
    Ok((obj, rng))
}

/// The training data of a run: the text file `data` (byte-level tokens) if given, else the seeded
/// grammar with `alphabet` symbols and `branching` successors per context. Checked against the model's
/// vocabulary before anything is drawn; the errors name the flags.
pub fn open(
    data: Option<&std::path::Path>,
    alphabet: usize,
    branching: usize,
    seed: u64,
    vocab_size: usize,
) -> Result<Box<dyn Corpus>, DataError> {
    if let Some(path) = data {
        return Ok(Box::new(TextBytes::from_file(path, seed)?));
    }
    if !(2..=vocab_size).contains(&alphabet) {
        return Err(DataError::Flag {
            flag: "--grammar-alphabet",
            why: format!("is {alphabet}; it must be in 2..={vocab_size} (the model's vocabulary)"),
        });
    }
    if !(1..=alphabet).contains(&branching) {
        return Err(DataError::Flag {
            flag: "--grammar-branching",
            why: format!("is {branching}; it must be in 1..={alphabet} (the alphabet)"),
        });
    }
    Ok(Box::new(Grammar::new(alphabet, branching, seed)))
}

/// The seeded second-order Markov grammar.
#[derive(Clone, Debug)]
pub struct Grammar {
    alphabet: usize,
    /// For each context a·alphabet + b: (next symbols, cumulative probabilities).
    rules: Vec<(Vec<usize>, Vec<f64>)>,
    entropy: f64,
    rng: Rng,
    state: (usize, usize),
}

impl Grammar {
    pub fn new(alphabet: usize, branching: usize, seed: u64) -> Self {
        assert!(
            alphabet >= 2 && branching >= 1 && branching <= alphabet,
            "need 1 ≤ branching ≤ alphabet, alphabet ≥ 2"
        );
        let mut rng = Rng::new(seed);
        let mut rules = Vec::with_capacity(alphabet * alphabet);
        let mut probs_all = Vec::with_capacity(alphabet * alphabet);
        for _ in 0..alphabet * alphabet {
            let mut next: Vec<usize> = Vec::new();
            while next.len() < branching {
                let s = rng.below(alphabet);
                if !next.contains(&s) {
                    next.push(s);
                }
            }
            let w: Vec<f64> = (0..branching).map(|_| 0.05 + rng.uniform().powi(2)).collect();
            let total: f64 = w.iter().sum();
            let p: Vec<f64> = w.iter().map(|x| x / total).collect();
            let cum = p
                .iter()
                .scan(0.0, |acc, x| {
                    *acc += x;
                    Some(*acc)
                })
                .collect();
            probs_all.push(p);
            rules.push((next, cum));
        }
        // Stationary distribution of the pair chain (a, b) → (b, c).
        let n = alphabet * alphabet;
        let mut pi = vec![1.0 / n as f64; n];
        for _ in 0..500 {
            let mut next_pi = vec![0.0; n];
            for ctx in 0..n {
                let b = ctx % alphabet;
                for (c, p) in rules[ctx].0.iter().zip(&probs_all[ctx]) {
                    next_pi[b * alphabet + c] += pi[ctx] * p;
                }
            }
            // Lazy step keeps the iteration converging on periodic chains.
            pi = pi.iter().zip(&next_pi).map(|(a, b)| 0.5 * a + 0.5 * b).collect();
        }
        let entropy = (0..n).map(|ctx| pi[ctx] * probs_all[ctx].iter().map(|p| -p * p.ln()).sum::<f64>()).sum();
        let state = (rng.below(alphabet), rng.below(alphabet));
        Grammar { alphabet, rules, entropy, rng, state }
    }

    /// Entropy rate in nats per token.
    pub fn entropy(&self) -> f64 {
        self.entropy
    }

    fn step(&mut self) -> usize {
        let (a, b) = self.state;
        let (next, cum) = &self.rules[a * self.alphabet + b];
        let u = self.rng.uniform();
        let c = next[cum.iter().position(|x| u < *x).unwrap_or(next.len() - 1)];
        self.state = (b, c);
        c
    }
}

impl Corpus for Grammar {
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64> {
        // Each sequence continues the chain after a short burn-in, so sequences are samples of the
        // stationary process.
        let mut out = Vec::with_capacity(batch * seq_len);
        for _ in 0..batch {
            for _ in 0..8 {
                self.step();
            }
            out.extend((0..seq_len).map(|_| self.step() as i64));
        }
        out
    }
    fn vocab_size(&self) -> usize {
        self.alphabet
    }
    fn best_loss(&self) -> Option<f64> {
        Some(self.entropy)
    }
    fn describe(&self) -> String {
        format!(
            "synthetic 2nd-order grammar over {} symbols, entropy rate {:.4} nats/token",
            self.alphabet, self.entropy
        )
    }
    fn position(&self) -> serde_json::Value {
        serde_json::json!({"describe": self.describe(), "rng": self.rng.0, "chain": [self.state.0, self.state.1]})
    }
    fn restore_position(&mut self, position: &serde_json::Value) -> Result<(), DataError> {
        let (obj, rng) = check_position(position, &self.describe())?;
        let chain: Vec<usize> = obj
            .get("chain")
            .and_then(|c| c.as_array())
            .map(|c| c.iter().filter_map(|x| x.as_u64().map(|x| x as usize)).collect())
            .unwrap_or_default();
        match chain[..] {
            [a, b] if a < self.alphabet && b < self.alphabet => self.state = (a, b),
            _ => return Err(DataError::GrammarState),
        }
        self.rng.0 = rng;
        Ok(())
    }
}

/// Any UTF-8 text as bytes (vocabulary 256); batches are random windows.
#[derive(Clone, Debug)]
pub struct TextBytes {
    bytes: Vec<u8>,
    rng: Rng,
    name: String,
}

impl TextBytes {
    pub fn from_file(path: &std::path::Path, seed: u64) -> Result<Self, DataError> {
        let refuse = |why: String| DataError::Flag { flag: "--data", why: format!("{}: {why}", path.display()) };
        let text = std::fs::read_to_string(path).map_err(|e| refuse(format!("{e} (a UTF-8 text file is expected)")))?;
        if text.len() < 2 {
            return Err(refuse("needs at least 2 bytes of text".into()));
        }
        Ok(TextBytes { bytes: text.into_bytes(), rng: Rng::new(seed), name: path.display().to_string() })
    }
}

impl Corpus for TextBytes {
    fn batch(&mut self, batch: usize, seq_len: usize) -> Vec<i64> {
        let n = self.bytes.len();
        let mut out = Vec::with_capacity(batch * seq_len);
        for _ in 0..batch {
            let start = if n > seq_len { self.rng.below(n - seq_len) } else { 0 };
            out.extend((0..seq_len).map(|i| self.bytes[(start + i) % n] as i64));
        }
        out
    }
    fn vocab_size(&self) -> usize {
        256
    }
    fn best_loss(&self) -> Option<f64> {
        None
    }
    fn describe(&self) -> String {
        format!("{} ({} bytes, byte-level tokens)", self.name, self.bytes.len())
    }
    fn position(&self) -> serde_json::Value {
        serde_json::json!({"describe": self.describe(), "rng": self.rng.0})
    }
    fn restore_position(&mut self, position: &serde_json::Value) -> Result<(), DataError> {
        self.rng.0 = check_position(position, &self.describe())?.1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_matches_the_empirical_conditional_entropy() {
        let mut g = Grammar::new(6, 3, 1);
        let h = g.entropy();
        // Estimate H(next | prev two) from a long sample: counts of (a, b, c).
        let seq = g.batch(1, 400_000);
        let mut counts = std::collections::HashMap::new();
        for w in seq.windows(3) {
            *counts.entry((w[0], w[1], w[2])).or_insert(0usize) += 1;
        }
        let mut ctx = std::collections::HashMap::new();
        for ((a, b, _), c) in &counts {
            *ctx.entry((*a, *b)).or_insert(0usize) += c;
        }
        let total = (seq.len() - 2) as f64;
        let est: f64 = counts
            .iter()
            .map(|((a, b, _), c)| {
                let p_ctx = ctx[&(*a, *b)] as f64;
                -(*c as f64 / total) * (*c as f64 / p_ctx).ln()
            })
            .sum();
        assert!((est - h).abs() < 0.01, "closed form {h}, sampled {est}");
    }

    #[test]
    fn a_restored_position_continues_the_stream() {
        let (mut a, mut b) = (Grammar::new(8, 3, 5), Grammar::new(8, 3, 5));
        a.batch(3, 10);
        let saved = a.position();
        let want = a.batch(2, 10);
        b.restore_position(&saved).unwrap();
        assert_eq!(b.batch(2, 10), want);
        assert!(Grammar::new(9, 3, 5).restore_position(&saved).unwrap_err().to_string().contains("trained on"));
    }

    #[test]
    fn same_seed_same_data() {
        assert_eq!(Grammar::new(32, 3, 7).batch(2, 16), Grammar::new(32, 3, 7).batch(2, 16));
        assert_ne!(Grammar::new(32, 3, 7).batch(2, 16), Grammar::new(32, 3, 8).batch(2, 16));
    }
}
