//! An event at a point in virtual time, ordered earliest first in a
//! `BinaryHeap` (a max-heap), ties in the order they were pushed.

use std::cmp::Ordering;

#[derive(Debug, Clone, Copy)]
pub struct Timed<E> {
    pub t: f64,
    pub seq: u64,
    pub ev: E,
}

impl<E> PartialEq for Timed<E> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<E> Eq for Timed<E> {}
impl<E> PartialOrd for Timed<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Timed<E> {
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}
