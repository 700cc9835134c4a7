//! top-p (nucleus): keeps the smallest prefix of the sorted candidates whose probability
//! mass reaches p.

use crate::candidates::{bucket_partial_sort, Candidates, TokenData};
use crate::error::{check_not_nan, SamplingError};
use crate::sampler::Sampler;

/// `llama_sampler_init_top_p(p, min_keep)`. Large unsorted arrays (> 1024) are sorted
/// lazily as llama.cpp does: the top 256 first, everything only if 256 are not enough.
#[derive(Debug, Clone)]
pub struct TopP {
    p: f32,
    min_keep: usize,
    buf_sort: Vec<TokenData>,
}

impl TopP {
    /// A top-p sampler; p ≥ 1 disables it.
    pub fn new(p: f32, min_keep: usize) -> Result<Self, SamplingError> {
        check_not_nan("p", p)?;
        Ok(TopP { p, min_keep, buf_sort: Vec::new() })
    }
}

impl Sampler for TopP {
    fn name(&self) -> &'static str {
        "top-p"
    }

    fn apply(&mut self, c: &mut Candidates) {
        if self.p >= 1.0 || c.data.is_empty() {
            return;
        }
        c.softmax(false);
        let size = c.data.len();
        let mut k = size;
        // whether the sorted view lives in buf_sort (llama.cpp's pdata) rather than in c.data
        let mut in_buf = false;
        if !c.sorted && size > 1024 {
            k = 256.min(size);
            bucket_partial_sort(&c.data, k, &mut self.buf_sort);
            in_buf = true;
        } else if !c.sorted {
            c.partial_sort_inplace(k);
        }
        let mut cum_sum = 0.0f32;
        let mut last_idx = size;
        for i in 0..size {
            let p = if in_buf { self.buf_sort[i].p } else { c.data[i].p };
            cum_sum += p;
            if cum_sum >= self.p && i + 1 >= self.min_keep {
                last_idx = i + 1;
                break;
            }
            // past the partial sort: sort everything and go on
            if !c.sorted && i == k - 1 {
                k = size;
                bucket_partial_sort(&c.data, k, &mut self.buf_sort);
                in_buf = true;
            }
        }
        if !c.sorted {
            c.data[..last_idx].copy_from_slice(&self.buf_sort[..last_idx]);
            c.sorted = true;
        }
        c.data.truncate(last_idx);
    }

    fn clone_box(&self) -> Box<dyn Sampler> {
        Box::new(TopP { p: self.p, min_keep: self.min_keep, buf_sort: Vec::new() })
    }
}
