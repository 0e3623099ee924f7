//! Expert placement: which rank of an expert group holds each routed expert, and in which local slot.
//! Dispatch sorts rows by *position* (`rank · E/EP + slot`), so the rows for one rank are contiguous
//! whatever the placement — the plan's initial one, or one that migration changed.

/// Expert id → (rank of the expert group, local slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertPlacement {
    rank_of: Vec<usize>,
    slot_of: Vec<usize>,
    ranks: usize,
}

impl ExpertPlacement {
    /// From expert id → rank (the plan file's `expert_placement`). Each of the `ranks` ranks must hold
    /// the same number of experts; a rank's experts take its slots in increasing id order.
    pub fn new(rank_of: Vec<usize>, ranks: usize) -> Result<Self, String> {
        let e = rank_of.len();
        if ranks == 0 || e % ranks != 0 {
            return Err(format!("expert placement: {e} experts cannot be spread evenly over {ranks} ranks"));
        }
        let mut next = vec![0usize; ranks];
        let mut slot_of = Vec::with_capacity(e);
        for (expert, &r) in rank_of.iter().enumerate() {
            let Some(n) = next.get_mut(r) else {
                return Err(format!("expert placement: expert {expert} on rank {r}, but the group has {ranks} ranks"));
            };
            slot_of.push(*n);
            *n += 1;
        }
        if next.iter().any(|n| *n != e / ranks) {
            return Err(format!("expert placement: ranks hold {next:?} experts; each must hold {}", e / ranks));
        }
        Ok(ExpertPlacement { rank_of, slot_of, ranks })
    }

    /// Experts `[r · E/ranks, (r + 1) · E/ranks)` on rank r.
    pub fn contiguous(experts: usize, ranks: usize) -> Result<Self, String> {
        let per = experts / ranks.max(1);
        Self::new((0..experts).map(|e| e / per.max(1)).collect(), ranks)
    }

    pub fn num_experts(&self) -> usize {
        self.rank_of.len()
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    pub fn local_experts(&self) -> usize {
        self.rank_of.len() / self.ranks
    }

    pub fn rank_of(&self, expert: usize) -> usize {
        self.rank_of[expert]
    }

    /// Position of each expert in dispatch order: `rank · E/ranks + slot`.
    pub fn positions(&self) -> Vec<usize> {
        let local = self.local_experts();
        self.rank_of.iter().zip(&self.slot_of).map(|(r, s)| r * local + s).collect()
    }

    /// The experts of `rank`, in slot order.
    pub fn experts_of(&self, rank: usize) -> Vec<usize> {
        let mut v: Vec<(usize, usize)> =
            (0..self.rank_of.len()).filter(|e| self.rank_of[*e] == rank).map(|e| (self.slot_of[e], e)).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, e)| e).collect()
    }

    /// Tokens per rank of the group from tokens per expert.
    pub fn rank_load(&self, tokens_per_expert: &[usize]) -> Vec<usize> {
        let mut load = vec![0; self.ranks];
        for (e, t) in tokens_per_expert.iter().enumerate() {
            load[self.rank_of[e]] += t;
        }
        load
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_group_each_ranks_experts_and_are_a_permutation() {
        let p = ExpertPlacement::new(vec![1, 0, 1, 0, 0, 1], 2).unwrap();
        assert_eq!(p.positions(), vec![3, 0, 4, 1, 2, 5]);
        assert_eq!(p.experts_of(0), vec![1, 3, 4]);
        assert_eq!(p.experts_of(1), vec![0, 2, 5]);
        assert_eq!(p.rank_load(&[1, 2, 3, 4, 5, 6]), vec![11, 10]);
        assert_eq!(ExpertPlacement::contiguous(8, 4).unwrap().positions(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn uneven_or_out_of_range_placements_are_refused() {
        assert!(ExpertPlacement::new(vec![0, 0, 0, 1], 2).unwrap_err().contains("each must hold 2"));
        assert!(ExpertPlacement::new(vec![0, 2], 2).unwrap_err().contains("expert 1 on rank 2"));
        assert!(ExpertPlacement::new(vec![0, 1, 0], 2).unwrap_err().contains("evenly"));
    }
}
