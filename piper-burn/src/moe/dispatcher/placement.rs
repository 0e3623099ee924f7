//! Expert placement: which rank of an expert group holds each routed expert, and in which local slot.
//! Dispatch sorts rows by *position* (`rank · E/EP + slot`), so the rows for one rank are contiguous
//! whatever the placement — the plan's initial one, or one that migration changed.

/// A placement that cannot hold: experts spread unevenly, or a rank or slot outside the group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("expert placement: {experts} experts cannot be spread evenly over {ranks} ranks")]
    Uneven { experts: usize, ranks: usize },
    #[error("expert placement: expert {expert} on rank {rank}, but the group has {ranks} ranks")]
    RankOutside { expert: usize, rank: usize, ranks: usize },
    #[error("expert placement: ranks hold {held:?} experts; each must hold {each}")]
    Unbalanced { held: Vec<usize>, each: usize },
    #[error("migration: {placed} experts placed, the layer has {experts}")]
    Count { placed: usize, experts: usize },
    #[error("expert placement: {slots} slots for {experts} experts")]
    Slots { slots: usize, experts: usize },
    #[error("expert placement: slot {slot} on rank {rank} is outside 0..{local}")]
    SlotOutside { slot: usize, rank: usize, local: usize },
    #[error("expert placement: two experts in slot {slot} of rank {rank}")]
    SlotTaken { slot: usize, rank: usize },
}

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
    pub fn new(rank_of: Vec<usize>, ranks: usize) -> Result<Self, PlacementError> {
        let e = rank_of.len();
        if ranks == 0 || !e.is_multiple_of(ranks) {
            return Err(PlacementError::Uneven { experts: e, ranks });
        }
        let mut next = vec![0usize; ranks];
        let mut slot_of = Vec::with_capacity(e);
        for (expert, &r) in rank_of.iter().enumerate() {
            let Some(n) = next.get_mut(r) else {
                return Err(PlacementError::RankOutside { expert, rank: r, ranks });
            };
            slot_of.push(*n);
            *n += 1;
        }
        if next.iter().any(|n| *n != e / ranks) {
            return Err(PlacementError::Unbalanced { held: next, each: e / ranks });
        }
        Ok(ExpertPlacement { rank_of, slot_of, ranks })
    }

    /// The placement after migration moved experts to `new_rank_of`: an expert that stays keeps its slot;
    /// the slots an expert left are taken by the arriving experts, both in increasing order (every rank
    /// computes the same slots from the same decision).
    pub fn migrated(&self, new_rank_of: &[usize]) -> Result<Self, PlacementError> {
        let fresh = ExpertPlacement::new(new_rank_of.to_vec(), self.ranks)?;
        if fresh.num_experts() != self.num_experts() {
            return Err(PlacementError::Count { placed: fresh.num_experts(), experts: self.num_experts() });
        }
        let mut slot_of = vec![usize::MAX; self.num_experts()];
        for r in 0..self.ranks {
            let mut vacated: Vec<usize> = Vec::new();
            for e in self.experts_of(r) {
                if new_rank_of[e] == r {
                    slot_of[e] = self.slot_of[e];
                } else {
                    vacated.push(self.slot_of[e]);
                }
            }
            vacated.sort_unstable();
            let arriving = (0..self.num_experts()).filter(|e| new_rank_of[*e] == r && self.rank_of[*e] != r);
            for (e, slot) in arriving.zip(vacated) {
                slot_of[e] = slot;
            }
        }
        Ok(ExpertPlacement { rank_of: new_rank_of.to_vec(), slot_of, ranks: self.ranks })
    }

    /// A saved placement (expert id → rank and → slot), checked: every rank holds E/ranks experts in
    /// distinct slots `0..E/ranks`.
    pub fn from_parts(rank_of: Vec<usize>, slot_of: Vec<usize>, ranks: usize) -> Result<Self, PlacementError> {
        let base = ExpertPlacement::new(rank_of.clone(), ranks)?;
        let local = base.local_experts();
        let mut seen = vec![false; base.num_experts()];
        if slot_of.len() != rank_of.len() {
            return Err(PlacementError::Slots { slots: slot_of.len(), experts: rank_of.len() });
        }
        for (r, s) in rank_of.iter().zip(&slot_of) {
            let Some(used) = seen.get_mut(r * local + s).filter(|_| *s < local) else {
                return Err(PlacementError::SlotOutside { slot: *s, rank: *r, local });
            };
            if std::mem::replace(used, true) {
                return Err(PlacementError::SlotTaken { slot: *s, rank: *r });
            }
        }
        Ok(ExpertPlacement { rank_of, slot_of, ranks })
    }

    /// Expert id → local slot.
    pub fn slots(&self) -> &[usize] {
        &self.slot_of
    }

    /// Local slot of `expert` on its rank.
    pub fn slot_of(&self, expert: usize) -> usize {
        self.slot_of[expert]
    }

    /// Expert id → rank, as the plan file and the planner's migration write it.
    pub fn ranks_of(&self) -> Vec<u64> {
        self.rank_of.iter().map(|r| *r as u64).collect()
    }

    /// Experts `[r · E/ranks, (r + 1) · E/ranks)` on rank r.
    pub fn contiguous(experts: usize, ranks: usize) -> Result<Self, PlacementError> {
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
    fn migration_keeps_staying_experts_in_their_slots() {
        let p = ExpertPlacement::contiguous(6, 2).unwrap(); // rank 0: 0 1 2, rank 1: 3 4 5
        let q = p.migrated(&[1, 0, 0, 0, 1, 1]).unwrap(); // 0 ↔ 3
        assert_eq!(q.experts_of(0), vec![3, 1, 2]);
        assert_eq!(q.experts_of(1), vec![0, 4, 5]);
        assert_eq!((q.slot_of(3), q.slot_of(0)), (0, 0));
        // Positions are still a permutation, and unequal counts are refused.
        let mut pos = q.positions();
        pos.sort_unstable();
        assert_eq!(pos, (0..6).collect::<Vec<_>>());
        assert!(p.migrated(&[1, 1, 0, 0, 1, 1]).is_err());
    }

    #[test]
    fn uneven_or_out_of_range_placements_are_refused() {
        assert!(ExpertPlacement::new(vec![0, 0, 0, 1], 2).unwrap_err().to_string().contains("each must hold 2"));
        assert!(ExpertPlacement::new(vec![0, 2], 2).unwrap_err().to_string().contains("expert 1 on rank 2"));
        assert!(ExpertPlacement::new(vec![0, 1, 0], 2).unwrap_err().to_string().contains("evenly"));
    }
}
