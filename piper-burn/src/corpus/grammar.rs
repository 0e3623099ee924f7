//! The seeded grammar: a second-order Markov chain over `alphabet` symbols. Every pair of previous
//! symbols allows `branching` next symbols with random probabilities. Its entropy rate, the lowest
//! cross-entropy any model can reach, is `Σ_(a,b) π(a,b) · H(next | a, b)` with π the stationary
//! distribution of the pair chain (power iteration).

use super::{Corpus, DataError, Rng, check_position};

/// The seeded second-order Markov grammar.
#[derive(Clone, Debug)]
pub struct Grammar {
    alphabet: usize,
    /// For each context a·alphabet + b: (next symbols, cumulative probabilities).
    rules: Vec<(Vec<usize>, Vec<f64>)>,
    entropy: f64,
    rng: Rng,
    state: (usize, usize),
    seed: u64,
    held_out: Vec<i64>,
}

/// Salt of the held-out stream's seed: the same process, another draw.
const HELD_OUT_SALT: u64 = 0x0FE7_A1D5_5EED_u64;

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
        Grammar { alphabet, rules, entropy, rng, state, seed, held_out: Vec::new() }
    }

    /// Entropy rate in nats per token.
    pub fn entropy(&self) -> f64 {
        self.entropy
    }

    /// Whether the grammar allows `c` after `a, b`.
    pub fn allows(&self, a: usize, b: usize, c: usize) -> bool {
        a < self.alphabet && b < self.alphabet && self.rules[a * self.alphabet + b].0.contains(&c)
    }

    /// Of the transitions into positions `first..` of `ids` (each after the two ids before it), how many
    /// the grammar allows, and how many there are: the share of a model's generated tokens that follow
    /// the grammar (ids outside the alphabet are not allowed).
    pub fn allowed_transitions(&self, ids: &[i64], first: usize) -> (usize, usize) {
        let symbol = |x: i64| usize::try_from(x).ok().filter(|s| *s < self.alphabet);
        let targets = first.max(2)..ids.len();
        let allowed = targets
            .clone()
            .filter(|&i| match (symbol(ids[i - 2]), symbol(ids[i - 1]), symbol(ids[i])) {
                (Some(a), Some(b), Some(c)) => self.allows(a, b, c),
                _ => false,
            })
            .count();
        (allowed, targets.len())
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
        let (obj, rng) = check_position(position, &self.describe(), &self.describe())?;
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
    fn hold_out(&mut self, sequences: usize, len: usize) -> Result<(), DataError> {
        let mut stream = self.clone();
        stream.rng = Rng::new(self.seed ^ HELD_OUT_SALT);
        stream.state = (stream.rng.below(self.alphabet), stream.rng.below(self.alphabet));
        self.held_out = stream.batch(sequences, len);
        Ok(())
    }
    fn held_out(&self) -> &[i64] {
        &self.held_out
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

    /// The grammar's own stream follows it everywhere; a uniform random stream follows it about
    /// branching / alphabet of the time; symbols outside the alphabet never do.
    #[test]
    fn allowed_transitions_count_what_the_grammar_allows() {
        let mut g = Grammar::new(12, 3, 4);
        let own = g.batch(1, 2000);
        assert_eq!(g.allowed_transitions(&own, 0), (1998, 1998));
        let mut rng = Rng::new(9);
        let noise: Vec<i64> = (0..20_000).map(|_| rng.below(12) as i64).collect();
        let (allowed, total) = g.allowed_transitions(&noise, 100);
        let share = allowed as f64 / total as f64;
        assert!((share - 0.25).abs() < 0.02 && total == 19_900, "{share}");
        assert_eq!(g.allowed_transitions(&[own[0], own[1], 12, -1], 2), (0, 2));
    }

    #[test]
    fn same_seed_same_data() {
        assert_eq!(Grammar::new(32, 3, 7).batch(2, 16), Grammar::new(32, 3, 7).batch(2, 16));
        assert_ne!(Grammar::new(32, 3, 7).batch(2, 16), Grammar::new(32, 3, 8).batch(2, 16));
    }
}
