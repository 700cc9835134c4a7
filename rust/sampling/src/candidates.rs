//! The candidate array (llama_token_data_array) and the sorting and softmax steps the
//! samplers share, with llama.cpp's exact semantics.

use crate::stdsort;

/// One candidate token: its id, its logit and its probability as the last sampler left it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenData {
    /// The token id.
    pub id: u32,
    /// The (possibly modified) logit.
    pub logit: f32,
    /// The probability, where a sampler computed one (0 otherwise).
    pub p: f32,
}

/// The candidates a chain works on, like `llama_token_data_array`.
///
/// `data` holds the candidates still in play, in the order the samplers left them;
/// `sorted` says they are in descending logit order; `selected` is the index (into
/// `data`) of the chosen token once a selecting sampler ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    /// The candidates, in the order the samplers left them.
    pub data: Vec<TokenData>,
    /// Index into `data` of the selected candidate, if a sampler selected one.
    pub selected: Option<usize>,
    /// Whether `data` is sorted by descending logit.
    pub sorted: bool,
}

impl Candidates {
    /// Candidates for every token of a logit vector: ids 0..n, p = 0, unsorted.
    pub fn from_logits(logits: &[f32]) -> Self {
        let mut c = Candidates::default();
        c.fill_from_logits(logits);
        c
    }

    /// Refills in place (reusing the allocation) from a logit vector.
    pub fn fill_from_logits(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data.extend(logits.iter().enumerate().map(|(i, &logit)| TokenData { id: i as u32, logit, p: 0.0 }));
        self.selected = None;
        self.sorted = false;
    }

    /// The number of candidates left.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether no candidate is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The selected token id, if a sampler selected one.
    pub fn selected_token(&self) -> Option<u32> {
        self.selected.and_then(|i| self.data.get(i)).map(|t| t.id)
    }

    /// `llama_sampler_softmax_impl`: sorts first if asked (and not sorted yet), then sets
    /// every p to the normalized exp(logit - max), summing in float as llama.cpp does.
    pub(crate) fn softmax(&mut self, do_sort: bool) {
        if self.data.is_empty() {
            return;
        }
        if do_sort && !self.sorted {
            let n = self.data.len();
            self.partial_sort_inplace(n);
        }
        let mut max_l = self.data[0].logit;
        if !self.sorted {
            for t in &self.data[1..] {
                max_l = max_l.max_cxx(t.logit);
            }
        }
        let mut cum_sum = 0.0f32;
        for t in &mut self.data {
            let p = (t.logit - max_l).exp();
            t.p = p;
            cum_sum += p;
        }
        for t in &mut self.data {
            t.p /= cum_sum;
        }
    }

    /// `llama_token_data_array_partial_sort_inplace`: keeps the `npartial` largest logits,
    /// in descending order, as llama.cpp's heap select (npartial ≤ 128) or bucket sort leaves them.
    pub(crate) fn partial_sort_inplace(&mut self, npartial: usize) {
        let npartial = npartial.min(self.data.len());
        if npartial <= 128 {
            stdsort::partial_sort(&mut self.data, npartial, &mut logit_greater);
        } else {
            let mut tmp = Vec::new();
            bucket_partial_sort(&self.data, npartial, &mut tmp);
            self.data[..npartial].copy_from_slice(&tmp[..npartial]);
        }
        self.data.truncate(npartial);
        self.sorted = true;
    }

    /// `llama_sampler_top_k_impl`: keeps the k largest (k ≤ 0 keeps everything).
    pub(crate) fn top_k(&mut self, k: i32) {
        if k <= 0 {
            return;
        }
        let k = (k as usize).min(self.data.len());
        if !self.sorted {
            self.partial_sort_inplace(k);
        }
        self.data.truncate(k);
    }

    /// `llama_sampler_temp_impl`: divides by the temperature; at or below 0 keeps only the
    /// first maximum (every other logit becomes -inf).
    pub(crate) fn apply_temperature(&mut self, temp: f32) {
        if temp <= 0.0 {
            if self.data.is_empty() {
                return;
            }
            let mut max_i = 0;
            let mut max_l = self.data[0].logit;
            for i in 1..self.data.len() {
                if self.data[i].logit > max_l {
                    self.data[max_i].logit = f32::NEG_INFINITY;
                    max_i = i;
                    max_l = self.data[i].logit;
                } else {
                    self.data[i].logit = f32::NEG_INFINITY;
                }
            }
            return;
        }
        for t in &mut self.data {
            t.logit /= temp;
        }
    }
}

/// The comparator llama.cpp sorts candidates with.
pub(crate) fn logit_greater(a: &TokenData, b: &TokenData) -> bool {
    a.logit > b.logit
}

const N_BUCKETS: usize = 128;
const BUCKET_LOW: f32 = -10.0;
const BUCKET_HIGH: f32 = 10.0;
const BUCKET_SCALE: f32 = N_BUCKETS as f32 / (BUCKET_HIGH - BUCKET_LOW);
const BUCKET_INTER: f32 = -BUCKET_LOW * BUCKET_SCALE;

fn bucket_of(logit: f32) -> usize {
    let ib = cvt_f32_to_i32(BUCKET_SCALE * logit + BUCKET_INTER);
    ib.clamp(0, N_BUCKETS as i32 - 1) as usize
}

/// `llama_token_data_array_partial_sort`: scatters the candidates into 128 logit buckets
/// (keeping input order inside each), takes buckets from the top until `npartial` are
/// covered, sorts the full buckets with `std::sort` and the last one with
/// `std::partial_sort`. `res` receives every candidate of the buckets taken; its first
/// `npartial` entries are the sorted result.
pub(crate) fn bucket_partial_sort(src: &[TokenData], npartial: usize, res: &mut Vec<TokenData>) {
    let mut histo = [0usize; N_BUCKETS];
    let bucket_idx: Vec<u8> = src
        .iter()
        .map(|t| {
            let b = bucket_of(t.logit);
            histo[b] += 1;
            b as u8
        })
        .collect();
    // lowest bucket taken
    let mut nhave = 0;
    let mut ib = N_BUCKETS as isize - 1;
    while ib >= 0 {
        nhave += histo[ib as usize];
        if nhave >= npartial {
            break;
        }
        ib -= 1;
    }
    let ib = ib.max(0) as usize;
    res.clear();
    res.resize(nhave, TokenData { id: 0, logit: 0.0, p: 0.0 });
    // start of each taken bucket in res, highest bucket first
    let mut start = [0usize; N_BUCKETS];
    let mut offset = 0;
    for j in (ib..N_BUCKETS).rev() {
        start[j] = offset;
        offset += histo[j];
    }
    for (t, &b) in src.iter().zip(&bucket_idx) {
        let b = b as usize;
        if b >= ib {
            res[start[b]] = *t;
            start[b] += 1;
        }
    }
    let mut pos = 0;
    let mut ndone = 0;
    for j in (ib + 1..N_BUCKETS).rev() {
        stdsort::sort(&mut res[pos..pos + histo[j]], &mut logit_greater);
        pos += histo[j];
        ndone += histo[j];
    }
    let last_bucket = &mut res[pos..pos + histo[ib]];
    let keep = npartial.saturating_sub(ndone).min(last_bucket.len());
    stdsort::partial_sort(last_bucket, keep, &mut logit_greater);
}

/// C++'s `int(x)` as x86-64 executes it (cvttss2si): truncation toward zero, and the
/// "integer indefinite" value i32::MIN for NaN and anything out of range.
pub(crate) fn cvt_f32_to_i32(x: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// `std::max(a, b)` semantics for floats: returns `a` unless `a < b` (so NaN handling
/// follows C++, unlike `f32::max`).
pub(crate) trait MaxCxx {
    fn max_cxx(self, other: Self) -> Self;
}

impl MaxCxx for f32 {
    fn max_cxx(self, other: f32) -> f32 {
        if self < other {
            other
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_logits_numbers_the_tokens() {
        let c = Candidates::from_logits(&[0.5, -1.0]);
        assert_eq!(c.data[1], TokenData { id: 1, logit: -1.0, p: 0.0 });
        assert!(!c.sorted);
        assert_eq!(c.selected, None);
    }

    #[test]
    fn bucket_sort_agrees_with_a_full_sort_on_distinct_logits() {
        let logits: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 5003) as f32 * 0.007 - 17.0).collect();
        let mut c = Candidates::from_logits(&logits);
        c.partial_sort_inplace(300);
        let mut all = logits.clone();
        all.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let got: Vec<f32> = c.data.iter().map(|t| t.logit).collect();
        assert_eq!(got, all[..300].to_vec());
        assert!(c.sorted);
    }

    #[test]
    fn out_of_range_conversion_is_integer_indefinite() {
        assert_eq!(cvt_f32_to_i32(f32::INFINITY), i32::MIN);
        assert_eq!(cvt_f32_to_i32(-3.7), -3);
        assert_eq!(bucket_of(f32::NEG_INFINITY), 0);
        assert_eq!(bucket_of(9.99), 127);
    }
}
