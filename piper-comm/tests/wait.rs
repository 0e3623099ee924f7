//! Waiting on pending operations: `wait_groups` hands each group over as soon as it has completed — in
//! completion order, not the order given (HALO forwards a remote node's data as soon as it is all
//! there) — and `wait_all` keeps the order given.

use std::cell::Cell;
use std::rc::Rc;

use piper_comm::communicator::{Pending, wait_all, wait_groups};
use piper_comm::{LocalComm, Result};

/// Completes at its `at`-th poll of the whole wait (a shared clock), returning its id.
struct After {
    at: usize,
    id: u8,
    clock: Rc<Cell<usize>>,
}

impl Pending for After {
    fn peer(&self) -> usize {
        0
    }
    fn test(&mut self) -> Result<bool> {
        self.clock.set(self.clock.get() + 1);
        Ok(self.clock.get() >= self.at)
    }
    fn into_data(self: Box<Self>) -> Vec<u8> {
        vec![self.id]
    }
    fn abandon(self: Box<Self>) {}
}

#[test]
fn groups_are_handed_over_as_they_complete_not_in_the_order_given() {
    let comm = LocalComm::single();
    let clock = Rc::new(Cell::new(0));
    let op = |at, id| Box::new(After { at, id, clock: clock.clone() }) as Box<dyn Pending>;
    let groups = vec![vec![op(400, 1), op(10, 2)], vec![op(50, 3)], vec![], vec![op(200, 4), op(100, 5)]];
    let mut order = Vec::new();
    wait_groups(&comm, groups, "test", |g, data| {
        order.push((g, data));
        Ok(())
    })
    .unwrap();
    let want = vec![(2, vec![]), (1, vec![vec![3]]), (3, vec![vec![4], vec![5]]), (0, vec![vec![1], vec![2]])];
    assert_eq!(order, want);
}

#[test]
fn wait_all_keeps_the_order_given() {
    let comm = LocalComm::single();
    let clock = Rc::new(Cell::new(0));
    let op = |at, id| Box::new(After { at, id, clock: clock.clone() }) as Box<dyn Pending>;
    let got = wait_all(&comm, vec![op(90, 7), op(3, 8), op(30, 9)], "test").unwrap();
    assert_eq!(got, vec![vec![7], vec![8], vec![9]]);
}
