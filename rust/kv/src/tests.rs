//! Unit tests of the cache bookkeeping: slot search, masks, sequence operations, shifts,
//! defragmentation and state, each against values worked out from llama.cpp's algorithms.

use crate::*;

fn one_seq(n: usize, s: SeqId) -> Vec<Vec<SeqId>> {
    vec![vec![s]; n]
}

fn range(a: Pos, b: Pos) -> Vec<Pos> {
    (a..b).collect()
}

/// Places one micro-batch as a decode does (prepare, then apply) and returns its cells.
fn decode(kv: &mut KvCells, pos: &[Pos], seqs: &[Vec<SeqId>]) -> Vec<u32> {
    let ub = UBatchView::new(pos, seqs);
    let slots = kv.prepare(&[ub]).expect("room").remove(0);
    kv.apply_ubatch(&slots, &ub).expect("apply");
    slots
}

fn decode_seq0(kv: &mut KvCells, pos: &[Pos]) -> Vec<u32> {
    decode(kv, pos, &one_seq(pos.len(), 0))
}

fn find(kv: &KvCells, n: usize) -> Option<Vec<u32>> {
    let pos = vec![1000; n];
    kv.find_slot(&UBatchView::new(&pos, &one_seq(n, 0)))
        .unwrap()
}

const NEG: f32 = f32::NEG_INFINITY;

fn mask_row(
    kv: &KvCells,
    pos: Pos,
    seqs: &[SeqId],
    causal: bool,
    swa: Option<SwaParams>,
) -> Vec<f32> {
    let p = [pos];
    let s = [seqs.to_vec()];
    let ub = UBatchView::new(&p, &s);
    let n_kv = kv.size();
    let mut out = vec![1.0; n_kv as usize];
    match swa {
        Some(w) => kv.fill_mask_with(&ub, n_kv, causal, w, &mut out).unwrap(),
        None => kv.fill_mask(&ub, n_kv, causal, &mut out).unwrap(),
    }
    out
}

/// Indices of the visible cells of a mask row.
fn visible(row: &[f32]) -> Vec<usize> {
    row.iter()
        .enumerate()
        .filter(|(_, &v)| v == 0.0)
        .map(|(j, _)| j)
        .collect()
}

// ---------------------------------------------------------------- construction

#[test]
fn constructor_rejects_bad_sizes() {
    assert_eq!(KvCells::new(0, 1).unwrap_err(), KvError::ZeroSize);
    assert_eq!(KvCells::new(8, 0).unwrap_err(), KvError::InvalidSeqMax(0));
    assert_eq!(
        KvCells::new(8, 257).unwrap_err(),
        KvError::InvalidSeqMax(257)
    );
    let kv = KvCells::new(8, 256).unwrap();
    assert_eq!(
        (kv.size(), kv.used(), kv.head(), kv.n_seq_max()),
        (8, 0, 0, 256)
    );
    assert_eq!(kv.seq_pos_max(255).unwrap(), -1);
}

// ---------------------------------------------------------------- slot search

#[test]
fn fresh_cache_fills_from_zero_and_moves_head() {
    let mut kv = KvCells::new(8, 1).unwrap();
    assert_eq!(decode_seq0(&mut kv, &range(0, 4)), vec![0, 1, 2, 3]);
    assert_eq!((kv.head(), kv.used(), kv.used_max_p1()), (4, 4, 4));
    assert_eq!(decode_seq0(&mut kv, &[4]), vec![4]);
    assert_eq!(kv.head(), 5);
    assert_eq!(&kv.positions()[..6], &[0, 1, 2, 3, 4, -1]);
}

#[test]
fn holes_are_filled_non_contiguously_in_scan_order() {
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 7));
    assert!(kv.seq_rm(0, 2, 4).unwrap());
    assert_eq!(kv.head(), 2, "head moves to the first freed cell");
    assert_eq!(decode_seq0(&mut kv, &range(7, 10)), vec![2, 3, 7]);
    assert_eq!((kv.head(), kv.used()), (8, 8));
    assert_eq!(find(&kv, 1), None, "full cache");
    let pos = [10];
    let err = kv
        .prepare(&[UBatchView::new(&pos, &one_seq(1, 0))])
        .unwrap_err();
    assert_eq!(
        err,
        KvError::NoSlot {
            ubatch: 0,
            n_tokens: 1
        }
    );
}

#[test]
fn search_wraps_around_the_ring() {
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 6));
    kv.seq_rm(0, 0, 2).unwrap();
    // free cells 0 and 1 below a head at 6: no operation leaves this in a full cache, so set it
    kv.head = 6;
    assert_eq!(find(&kv, 4), Some(vec![6, 7, 0, 1]));
    assert_eq!(find(&kv, 5), None, "only four free cells");
}

#[test]
fn head_resets_when_enough_cells_lie_before_it() {
    let mut kv = KvCells::new(32, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 4));
    kv.head = 20;
    // 20 > used 4 + 2*1: start from 0
    assert_eq!(find(&kv, 1), Some(vec![4]));
    // 20 > 4 + 2*8 is false: start at the head
    assert_eq!(find(&kv, 8), Some((20..28).collect()));
    // 7 tokens: 20 > 18, from 0
    assert_eq!(find(&kv, 7), Some((4..11).collect()));
}

#[test]
fn too_many_tokens_or_empty_batches() {
    let kv = KvCells::new(4, 1).unwrap();
    assert_eq!(find(&kv, 5), None);
    assert_eq!(find(&kv, 4), Some(vec![0, 1, 2, 3]));
    let empty: [Pos; 0] = [];
    let no_seqs: [Vec<SeqId>; 0] = [];
    let err = kv
        .find_slot(&UBatchView::new(&empty, &no_seqs))
        .unwrap_err();
    assert_eq!(err, KvError::EmptyUBatch);
}

#[test]
fn ubatch_validation() {
    let mut kv = KvCells::new(8, 2).unwrap();
    let pos = [0, 1];
    let bad_len = one_seq(1, 0);
    assert_eq!(
        kv.prepare(&[UBatchView::new(&pos, &bad_len)]).unwrap_err(),
        KvError::UBatchShape { n_pos: 2, n_seq: 1 }
    );
    let no_seq = vec![vec![0], vec![]];
    assert_eq!(
        kv.prepare(&[UBatchView::new(&pos, &no_seq)]).unwrap_err(),
        KvError::TokenWithoutSeq { token: 1 }
    );
    let bad_seq = vec![vec![0], vec![2]];
    assert_eq!(
        kv.prepare(&[UBatchView::new(&pos, &bad_seq)]).unwrap_err(),
        KvError::InvalidSeqId {
            seq_id: 2,
            n_seq_max: 2
        }
    );
    let neg = [0, -1];
    assert_eq!(
        kv.prepare(&[UBatchView::new(&neg, &one_seq(2, 0))])
            .unwrap_err(),
        KvError::NegativePos { token: 1, pos: -1 }
    );
    // a repeated id in one token counts once
    let dup = vec![vec![1, 1, 0], vec![0]];
    decode(&mut kv, &pos, &dup);
    assert_eq!(kv.cells()[0], (0, vec![0, 1]));
    kv.seq_rm(1, -1, -1).unwrap();
    assert_eq!(kv.seq_pos_max(1).unwrap(), -1);
    // arrays given as fixed-size ids work too
    let arr = [[0], [0]];
    let p2 = [2, 3];
    let slots = kv.find_slot(&UBatchView::new(&p2, &arr)).unwrap().unwrap();
    assert_eq!(slots, vec![2, 3]);
}

#[test]
fn apply_ubatch_rejects_bad_slots() {
    let mut kv = KvCells::new(4, 2).unwrap();
    decode(&mut kv, &[0], &[vec![0, 1]]);
    let pos = [1, 2];
    let seqs = one_seq(2, 0);
    let ub = UBatchView::new(&pos, &seqs);
    let before = kv.cells();
    for slots in [vec![1], vec![1, 4], vec![2, 2], vec![0, 1]] {
        assert!(
            matches!(kv.apply_ubatch(&slots, &ub), Err(KvError::InvalidSlots(_))),
            "{slots:?}"
        );
    }
    assert_eq!(kv.cells(), before);
}

// ---------------------------------------------------------------- sliding window reuse

#[test]
fn sliding_cache_reuses_hidden_cells_and_wraps() {
    let mut kv = KvCells::with_swa(8, 1, SwaParams::standard(2)).unwrap();
    decode_seq0(&mut kv, &range(0, 6));
    // cells 6, 7 are empty; then cell 0 (pos 0) is hidden from position 6
    assert_eq!(decode_seq0(&mut kv, &[6, 7, 8]), vec![6, 7, 0]);
    assert_eq!(kv.head(), 1);
    assert_eq!(kv.positions(), &[8, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(
        (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
        (1, 8)
    );
}

#[test]
fn reuse_purges_older_positions_of_the_sequence() {
    let mut kv = KvCells::with_swa(8, 1, SwaParams::standard(4)).unwrap();
    decode_seq0(&mut kv, &[4, 5, 6, 7, 0, 1, 2, 3]);
    let snapshot = kv.clone();
    // prepare simulates the purge but restores every cell
    let p = [8];
    let seqs = one_seq(1, 0);
    assert_eq!(
        kv.prepare(&[UBatchView::new(&p, &seqs)]).unwrap(),
        vec![vec![0]]
    );
    assert_eq!(kv.cells(), snapshot.cells());
    assert_eq!((kv.head(), kv.used()), (8, 8));
    // cell 0 (pos 4) is hidden from position 8; overwriting it removes positions 0..=4
    kv.apply_ubatch(&[0], &UBatchView::new(&p, &seqs)).unwrap();
    assert_eq!(kv.positions(), &[8, 5, 6, 7, -1, -1, -1, -1]);
    assert_eq!((kv.head(), kv.used()), (1, 4));
    assert_eq!(
        (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
        (5, 8)
    );
}

#[test]
fn shared_cells_are_never_reused() {
    let mut kv = KvCells::with_swa(4, 2, SwaParams::standard(1)).unwrap();
    decode(&mut kv, &range(0, 4), &vec![vec![0, 1]; 4]);
    assert_eq!(find(&kv, 1), None);
    kv.seq_rm(1, -1, -1).unwrap();
    assert_eq!(kv.head(), 4, "no cell was freed");
    assert_eq!(find(&kv, 1), Some(vec![0]));
    // a full cache never reuses
    let mut full = KvCells::new(4, 1).unwrap();
    decode_seq0(&mut full, &range(0, 4));
    assert_eq!(find(&full, 1), None);
}

// ---------------------------------------------------------------- prepare: all or none

#[test]
fn prepare_is_all_or_none() {
    let mut kv = KvCells::new(4, 1).unwrap();
    let (p1, p2, p3) = (range(0, 2), range(2, 5), range(2, 4));
    let (s2, s3) = (one_seq(2, 0), one_seq(3, 0));
    let err = kv
        .prepare(&[UBatchView::new(&p1, &s2), UBatchView::new(&p2, &s3)])
        .unwrap_err();
    assert_eq!(
        err,
        KvError::NoSlot {
            ubatch: 1,
            n_tokens: 3
        }
    );
    assert_eq!((kv.used(), kv.head()), (0, 0));
    assert!(kv.cells().iter().all(|c| c.0 == -1));

    let ubs = [UBatchView::new(&p1, &s2), UBatchView::new(&p3, &s2)];
    let slots = kv.prepare(&ubs).unwrap();
    assert_eq!(slots, vec![vec![0, 1], vec![2, 3]]);
    assert_eq!((kv.used(), kv.head()), (0, 0), "prepare changes nothing");
    for (s, ub) in slots.iter().zip(&ubs) {
        kv.apply_ubatch(s, ub).unwrap();
    }
    assert_eq!(kv.positions(), &[0, 1, 2, 3]);
    assert_eq!(
        kv.prepare::<Vec<SeqId>>(&[]).unwrap(),
        Vec::<Vec<u32>>::new()
    );
}

#[test]
fn prepare_failure_keeps_a_used_cache_intact() {
    let mut kv = KvCells::new(8, 2).unwrap();
    decode(&mut kv, &range(0, 3), &vec![vec![0, 1]; 3]);
    decode(&mut kv, &[3], &[vec![1]]);
    let before = (kv.cells(), kv.head(), kv.used());
    let (pa, pb) = (range(3, 6), range(6, 8));
    let (sa, sb) = (one_seq(3, 0), one_seq(2, 0));
    let err = kv
        .prepare(&[UBatchView::new(&pa, &sa), UBatchView::new(&pb, &sb)])
        .unwrap_err();
    assert_eq!(
        err,
        KvError::NoSlot {
            ubatch: 1,
            n_tokens: 2
        }
    );
    assert_eq!((kv.cells(), kv.head(), kv.used()), before);
    assert_eq!(kv.seq_pos_max(0).unwrap(), 2);
}

// ---------------------------------------------------------------- masks

#[test]
fn causal_mask_follows_cell_positions() {
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 4));
    let pos = [4, 5];
    let seqs = one_seq(2, 0);
    let ub = UBatchView::new(&pos, &seqs);
    let slots = kv.prepare(&[ub]).unwrap().remove(0);
    kv.apply_ubatch(&slots, &ub).unwrap();
    let n_kv = kv.n_kv_window();
    assert_eq!(n_kv, 8);
    let mut out = vec![0.5; 16];
    kv.fill_mask(&ub, n_kv, true, &mut out).unwrap();
    assert_eq!(&out[..8], &[0.0, 0.0, 0.0, 0.0, 0.0, NEG, NEG, NEG]);
    assert_eq!(&out[8..], &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, NEG, NEG]);
    // the order of cells does not matter, positions do
    kv.seq_rm(0, 0, 1).unwrap();
    decode_seq0(&mut kv, &[6]);
    assert_eq!(kv.positions()[0], 6);
    assert_eq!(
        visible(&mask_row(&kv, 5, &[0], true, None)),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(
        visible(&mask_row(&kv, 6, &[0], true, None)),
        vec![0, 1, 2, 3, 4, 5]
    );
    // without causality every cell of the sequence is visible
    assert_eq!(
        visible(&mask_row(&kv, 2, &[0], false, None)),
        vec![0, 1, 2, 3, 4, 5]
    );
}

#[test]
fn multi_sequence_mask_uses_the_first_id() {
    let mut kv = KvCells::new(8, 3).unwrap();
    decode(&mut kv, &[0, 1], &vec![vec![0, 1]; 2]);
    decode(&mut kv, &[2, 2], &[vec![0], vec![1]]);
    let pos = [3, 3, 2];
    let seqs = vec![vec![0], vec![1], vec![2, 0]];
    let ub = UBatchView::new(&pos, &seqs);
    let slots = kv.prepare(&[ub]).unwrap().remove(0);
    assert_eq!(slots, vec![4, 5, 6]);
    kv.apply_ubatch(&slots, &ub).unwrap();
    let mut out = vec![0.0; 24];
    kv.fill_mask(&ub, 8, true, &mut out).unwrap();
    let rows: Vec<Vec<usize>> = out.chunks(8).map(visible).collect();
    assert_eq!(rows[0], vec![0, 1, 2, 4, 6]);
    assert_eq!(rows[1], vec![0, 1, 3, 5]);
    // token 2 lists seq 2 first: it sees only cells of seq 2, not those of seq 0
    assert_eq!(rows[2], vec![6]);
    assert_eq!(kv.cells()[6], (2, vec![0, 2]));
}

#[test]
fn sliding_window_masks() {
    let mut kv = KvCells::with_swa(16, 1, SwaParams::standard(4)).unwrap();
    decode_seq0(&mut kv, &range(0, 11));
    assert_eq!(
        visible(&mask_row(&kv, 10, &[0], true, None)),
        vec![7, 8, 9, 10]
    );
    let none = Some(SwaParams::NONE);
    assert_eq!(
        visible(&mask_row(&kv, 10, &[0], true, none)),
        (0..11).collect::<Vec<_>>()
    );
    let chunked = Some(SwaParams {
        n_swa: 4,
        kind: SwaType::Chunked,
    });
    assert_eq!(
        visible(&mask_row(&kv, 10, &[0], true, chunked)),
        vec![8, 9, 10]
    );
    let sym = Some(SwaParams {
        n_swa: 4,
        kind: SwaType::Symmetric,
    });
    assert_eq!(
        visible(&mask_row(&kv, 5, &[0], false, sym)),
        vec![3, 4, 5, 6, 7]
    );
    assert_eq!(visible(&mask_row(&kv, 5, &[0], true, sym)), vec![3, 4, 5]);
}

#[test]
fn attention_window_is_padded_to_256() {
    let mut kv = KvCells::new(1024, 1).unwrap();
    assert_eq!(kv.n_kv_window(), 256);
    decode_seq0(&mut kv, &range(0, 300));
    assert_eq!(kv.n_kv_window(), 512);
    assert_eq!(kv.n_kv_window_padded(1024), 1024);
    let mut small = KvCells::new(300, 1).unwrap();
    assert_eq!(small.n_kv_window(), 256);
    decode_seq0(&mut small, &range(0, 260));
    assert_eq!(small.n_kv_window(), 300, "never beyond the cache");
    let tiny = KvCells::new(16, 1).unwrap();
    assert_eq!(tiny.n_kv_window(), 16);
}

#[test]
fn mask_arguments_are_checked() {
    let kv = KvCells::new(8, 1).unwrap();
    let pos = [0, 1];
    let seqs = one_seq(2, 0);
    let ub = UBatchView::new(&pos, &seqs);
    let mut short = vec![0.0; 15];
    assert!(matches!(
        kv.fill_mask(&ub, 8, true, &mut short),
        Err(KvError::InvalidMask(_))
    ));
    let mut big = vec![0.0; 18];
    assert!(matches!(
        kv.fill_mask(&ub, 9, true, &mut big),
        Err(KvError::InvalidMask(_))
    ));
    let mut none: Vec<f32> = vec![];
    kv.fill_mask(&ub, 0, true, &mut none).unwrap();
    let mut all = vec![0.0; 16];
    kv.fill_mask(&ub, 8, true, &mut all).unwrap();
    assert!(
        all.iter().all(|&v| v == NEG),
        "an empty cache hides everything"
    );
}

// ---------------------------------------------------------------- seq_rm

#[test]
fn seq_rm_ranges_shared_cells_and_all_sequences() {
    let mut kv = KvCells::new(16, 2).unwrap();
    decode(
        &mut kv,
        &range(0, 8),
        &[vec![vec![0, 1]; 4], one_seq(4, 0)].concat(),
    );
    decode(&mut kv, &[4, 5], &one_seq(2, 1));
    assert_eq!(kv.head(), 10);

    assert_eq!(kv.seq_rm(0, 2, 6), Ok(true));
    assert_eq!(
        kv.cells()[2],
        (2, vec![1]),
        "a shared cell only loses the id"
    );
    assert_eq!(kv.cells()[4], (-1, vec![]));
    assert_eq!(
        kv.cells()[8],
        (4, vec![1]),
        "other sequences keep their cells"
    );
    assert_eq!(kv.head(), 4);
    assert_eq!(
        (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
        (0, 7)
    );
    assert_eq!(
        (kv.seq_pos_min(1).unwrap(), kv.seq_pos_max(1).unwrap()),
        (0, 5)
    );

    let before = kv.cells();
    assert_eq!(kv.seq_rm(0, 5, 5), Ok(true));
    assert_eq!(kv.seq_rm(0, 7, 3), Ok(true));
    assert_eq!(kv.cells(), before, "empty ranges remove nothing");

    kv.seq_rm(1, -1, 2).unwrap();
    assert_eq!(kv.cells()[0], (0, vec![0]));
    assert_eq!(kv.seq_pos_min(1).unwrap(), 2);

    kv.seq_rm(0, 6, -1).unwrap();
    assert_eq!(kv.head(), 4, "freed cells after the head leave it");
    assert_eq!(kv.seq_pos_max(0).unwrap(), 1);

    assert_eq!(kv.seq_rm(-1, 3, -1), Ok(true));
    assert_eq!(kv.head(), 3);
    let live: Vec<_> = kv.cells().into_iter().filter(|c| c.0 >= 0).collect();
    assert_eq!(live, vec![(0, vec![0]), (1, vec![0]), (2, vec![1])]);
    assert_eq!(kv.used(), 3);

    assert_eq!(kv.seq_rm(-7, -1, -1), Ok(true));
    assert_eq!(kv.used(), 0);
    assert_eq!(kv.head(), 0);
    assert_eq!(
        kv.seq_rm(2, -1, -1),
        Err(KvError::InvalidSeqId {
            seq_id: 2,
            n_seq_max: 2
        })
    );
}

// ---------------------------------------------------------------- seq_cp / seq_keep

#[test]
fn seq_cp_adds_the_destination_once() {
    let mut kv = KvCells::new(8, 3).unwrap();
    decode_seq0(&mut kv, &range(0, 5));
    kv.seq_cp(0, 1, 1, 3).unwrap();
    assert_eq!(
        (kv.seq_pos_min(1).unwrap(), kv.seq_pos_max(1).unwrap()),
        (1, 2)
    );
    kv.seq_cp(0, 2, -1, -1).unwrap();
    kv.seq_cp(1, 2, -1, -1).unwrap();
    kv.seq_cp(0, 0, -1, -1).unwrap();
    assert_eq!(kv.cells()[1], (1, vec![0, 1, 2]));
    // each cell counts once for seq 2 even though it was copied twice
    kv.seq_rm(2, 1, 2).unwrap();
    assert_eq!(kv.seq_pos_min(2).unwrap(), 0);
    kv.seq_rm(2, 0, 1).unwrap();
    assert_eq!(kv.seq_pos_min(2).unwrap(), 2);
    kv.seq_rm(2, -1, -1).unwrap();
    assert_eq!(kv.seq_pos_max(2).unwrap(), -1);
    assert_eq!(kv.used(), 5);
    assert_eq!(
        kv.seq_cp(0, 3, -1, -1),
        Err(KvError::InvalidSeqId {
            seq_id: 3,
            n_seq_max: 3
        })
    );
    assert_eq!(
        kv.seq_cp(-1, 1, -1, -1),
        Err(KvError::InvalidSeqId {
            seq_id: -1,
            n_seq_max: 3
        })
    );
}

#[test]
fn seq_keep_frees_other_sequences() {
    let mut kv = KvCells::new(8, 3).unwrap();
    decode(&mut kv, &[0, 1], &vec![vec![0, 1, 2]; 2]);
    decode(&mut kv, &[2, 2, 2], &[vec![0], vec![1], vec![2]]);
    assert_eq!(kv.head(), 5);
    kv.seq_keep(1).unwrap();
    assert_eq!(kv.head(), 2);
    assert_eq!(
        kv.cells()[..5].to_vec(),
        vec![
            (0, vec![1]),
            (1, vec![1]),
            (-1, vec![]),
            (2, vec![1]),
            (-1, vec![])
        ]
    );
    assert_eq!(kv.seq_pos_min(0).unwrap(), -1);
    assert_eq!(kv.seq_pos_max(2).unwrap(), -1);
    assert_eq!(
        (kv.seq_pos_min(1).unwrap(), kv.seq_pos_max(1).unwrap()),
        (0, 2)
    );
    assert!(kv.seq_keep(-1).is_err());
}

// ---------------------------------------------------------------- seq_add / seq_div / shifts

#[test]
fn seq_add_shifts_frees_and_moves_the_head() {
    let mut kv = KvCells::new(16, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 8));
    kv.seq_add(0, 4, 4, 5).unwrap();
    kv.seq_add(0, -3, 0, 5).unwrap();
    kv.seq_add(0, 0, 4, 0).unwrap();
    assert_eq!(kv.head(), 8, "no-op calls keep the head");
    assert!(!kv.has_shift());

    kv.seq_add(0, 4, -1, 3).unwrap();
    assert_eq!(kv.positions()[..8].to_vec(), vec![0, 1, 2, 3, 7, 8, 9, 10]);
    assert_eq!(kv.head(), 0, "nothing freed: search from the start");
    assert!(kv.has_shift());
    kv.seq_add(0, 0, 2, -1).unwrap();
    assert_eq!(kv.positions()[..2].to_vec(), vec![-1, 0]);
    assert_eq!(kv.head(), 0);
    assert_eq!(
        (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
        (0, 10)
    );
    assert_eq!(
        kv.take_shifts(),
        vec![(1, -1), (4, 3), (5, 3), (6, 3), (7, 3)]
    );
    assert!(!kv.has_shift());
    assert!(kv.shifts().iter().all(|&d| d == 0));
    assert_eq!(kv.take_shifts(), vec![]);

    kv.seq_add(0, 7, 9, -100).unwrap();
    assert_eq!(kv.head(), 4, "head at the first freed cell");
    assert_eq!(kv.used(), 5);
    assert!(kv.has_shift(), "freeing by a shift still flags a shift");
    assert_eq!(kv.take_shifts(), vec![]);
}

#[test]
fn seq_add_moves_shared_cells_for_every_sequence() {
    let mut kv = KvCells::new(8, 2).unwrap();
    decode(&mut kv, &range(0, 3), &vec![vec![0, 1]; 3]);
    kv.seq_add(0, 1, -1, 10).unwrap();
    assert_eq!(kv.seq_pos_max(1).unwrap(), 12);
    kv.seq_add(1, 11, 12, -20).unwrap();
    assert_eq!(
        kv.cells()[1],
        (-1, vec![]),
        "the freed cell is gone for seq 0 too"
    );
    assert_eq!(kv.seq_pos_max(0).unwrap(), 12);
}

#[test]
fn seq_add_overflow_is_an_error_and_changes_nothing() {
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 3));
    let before = kv.cells();
    assert_eq!(
        kv.seq_add(0, 0, -1, Pos::MAX),
        Err(KvError::PositionOverflow {
            pos: 1,
            delta: Pos::MAX
        })
    );
    assert_eq!(kv.cells(), before);
    assert!(!kv.has_shift());
    assert!(kv.seq_add(1, 0, -1, 1).is_err());
    // very negative deltas free without overflowing
    kv.seq_add(0, 0, -1, Pos::MIN).unwrap();
    assert_eq!(kv.used(), 0);
}

#[test]
fn seq_div_accumulates_new_minus_old() {
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 8));
    kv.seq_div(0, 2, 6, 1).unwrap();
    kv.seq_div(0, 3, 3, 2).unwrap();
    assert!(!kv.has_shift());
    assert_eq!(kv.seq_div(0, 0, -1, 0), Err(KvError::InvalidDivisor(0)));
    assert_eq!(kv.seq_div(0, 0, -1, -2), Err(KvError::InvalidDivisor(-2)));
    kv.seq_div(0, 2, 6, 2).unwrap();
    assert_eq!(kv.positions(), &[0, 1, 1, 1, 2, 2, 6, 7]);
    assert_eq!(kv.take_shifts(), vec![(2, -1), (3, -2), (4, -2), (5, -3)]);
    assert_eq!(
        (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
        (0, 7)
    );
    // add then divide: the shift is always current minus original
    kv.seq_add(0, 6, -1, 4).unwrap();
    kv.seq_div(0, 10, -1, 2).unwrap();
    assert_eq!(kv.positions()[6..].to_vec(), vec![5, 5]);
    assert_eq!(kv.take_shifts(), vec![(6, -1), (7, -2)]);
    assert!(kv.seq_div(3, 0, -1, 2).is_err());
}

#[test]
fn self_extend_worked_example() {
    // llama-cli's grouped attention loop with ga_n = 2, ga_w = 4 over 5 tokens
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 5));
    let (ga_n, ga_w) = (2, 4);
    let (mut n_past, mut ga_i) = (5, 0);
    while n_past >= ga_i + ga_w {
        let ib = (ga_n * ga_i) / ga_w;
        let bd = (ga_w / ga_n) * (ga_n - 1);
        let dd = (ga_w / ga_n) - ib * bd - ga_w;
        kv.seq_add(0, ga_i, n_past, ib * bd).unwrap();
        kv.seq_div(0, ga_i + ib * bd, ga_i + ib * bd + ga_w, ga_n)
            .unwrap();
        kv.seq_add(0, ga_i + ib * bd + ga_w, n_past + ib * bd, dd)
            .unwrap();
        n_past -= bd;
        ga_i += ga_w / ga_n;
    }
    assert_eq!(n_past, 3);
    assert_eq!(kv.positions()[..5].to_vec(), vec![0, 0, 1, 1, 2]);
    assert_eq!(kv.take_shifts(), vec![(1, -1), (2, -1), (3, -2), (4, -2)]);
}

#[test]
fn clear_empties_everything() {
    let mut kv = KvCells::new(8, 2).unwrap();
    decode(&mut kv, &range(0, 4), &vec![vec![0, 1]; 4]);
    kv.seq_add(0, 0, -1, 2).unwrap();
    kv.clear();
    assert_eq!(
        (kv.used(), kv.head(), kv.has_shift(), kv.used_max_p1()),
        (0, 0, false, 0)
    );
    assert_eq!(kv.seq_pos_max(1).unwrap(), -1);
    assert!(kv.shifts().iter().all(|&d| d == 0));
    assert_eq!(decode_seq0(&mut kv, &[0]), vec![0]);
}

// ---------------------------------------------------------------- defragmentation

#[test]
fn defrag_plan_fills_holes_from_the_end() {
    let mut kv = KvCells::new(16, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 10));
    kv.seq_rm(0, 2, 4).unwrap();
    kv.seq_rm(0, 6, 7).unwrap();
    let plan = kv.defrag_plan(u32::MAX);
    assert_eq!(
        plan,
        vec![
            DefragMove {
                src: 7,
                dst: 6,
                len: 1
            },
            DefragMove {
                src: 8,
                dst: 2,
                len: 2
            }
        ]
    );
    assert_eq!(
        kv.defrag_plan(1),
        vec![DefragMove {
            src: 8,
            dst: 2,
            len: 2
        }],
        "the first run only"
    );
    kv.apply_defrag(&plan).unwrap();
    assert_eq!(
        kv.positions()[..10].to_vec(),
        vec![0, 1, 8, 9, 4, 5, 7, -1, -1, -1]
    );
    assert_eq!((kv.used(), kv.used_max_p1(), kv.head()), (7, 7, 0));
    assert_eq!(
        (kv.seq_pos_min(0).unwrap(), kv.seq_pos_max(0).unwrap()),
        (0, 9)
    );
    assert_eq!(kv.defrag_plan(u32::MAX), vec![]);
}

#[test]
fn defrag_moves_shifts_and_sequences_with_cells() {
    let mut kv = KvCells::new(8, 2).unwrap();
    decode(
        &mut kv,
        &range(0, 4),
        &[vec![0], vec![0], vec![0, 1], vec![1]],
    );
    kv.seq_rm(0, 0, 2).unwrap();
    kv.seq_add(1, 3, 4, 2).unwrap();
    let plan = kv.defrag_plan(u32::MAX);
    assert_eq!(
        plan,
        vec![DefragMove {
            src: 2,
            dst: 0,
            len: 2
        }]
    );
    kv.apply_defrag(&plan).unwrap();
    assert_eq!(
        kv.cells()[..4].to_vec(),
        vec![(2, vec![0, 1]), (5, vec![1]), (-1, vec![]), (-1, vec![])]
    );
    assert_eq!(kv.take_shifts(), vec![(1, 2)]);
}

#[test]
fn fragmentation_uses_the_old_formula() {
    let mut kv = KvCells::new(4096, 1).unwrap();
    let pos = range(0, 3000);
    decode_seq0(&mut kv, &pos);
    assert_eq!(kv.fragmentation(256), 0.0);
    kv.seq_rm(0, 0, 2000).unwrap();
    let f = kv.fragmentation(256);
    assert!((f - (1.0 - 1256.0 / 3000.0)).abs() < 1e-6, "{f}");
    assert!(kv.needs_defrag(0.5, 256));
    assert!(!kv.needs_defrag(0.6, 256));
    assert!(!kv.needs_defrag(0.0, 256), "threshold 0 disables");
    let plan = kv.defrag_plan(u32::MAX);
    assert_eq!(
        plan,
        vec![DefragMove {
            src: 2000,
            dst: 0,
            len: 1000
        }]
    );
    kv.apply_defrag(&plan).unwrap();
    assert_eq!(kv.used_max_p1(), 1000);
    assert_eq!(kv.positions()[0], 2000);
    assert_eq!(
        kv.fragmentation(256),
        0.0,
        "below 2048 cells nothing is fragmented"
    );
    let mut small = KvCells::new(1000, 1).unwrap();
    decode_seq0(&mut small, &range(0, 1000));
    small.seq_rm(0, 0, 900).unwrap();
    assert_eq!(small.fragmentation(32), 0.0);
}

#[test]
fn bad_defrag_plans_are_refused() {
    let mut kv = KvCells::new(8, 1).unwrap();
    decode_seq0(&mut kv, &range(0, 4));
    kv.seq_rm(0, 0, 2).unwrap();
    let before = kv.cells();
    let bad = [
        vec![DefragMove {
            src: 0,
            dst: 4,
            len: 1,
        }],
        vec![DefragMove {
            src: 2,
            dst: 3,
            len: 1,
        }],
        vec![DefragMove {
            src: 7,
            dst: 0,
            len: 2,
        }],
        vec![
            DefragMove {
                src: 2,
                dst: 0,
                len: 1,
            },
            DefragMove {
                src: 3,
                dst: 0,
                len: 1,
            },
        ],
        vec![
            DefragMove {
                src: 2,
                dst: 0,
                len: 1,
            },
            DefragMove {
                src: 2,
                dst: 1,
                len: 1,
            },
        ],
        vec![DefragMove {
            src: u32::MAX,
            dst: 0,
            len: 2,
        }],
    ];
    for plan in bad {
        assert!(
            matches!(kv.apply_defrag(&plan), Err(KvError::InvalidDefrag(_))),
            "{plan:?}"
        );
        assert_eq!(kv.cells(), before);
    }
}

// ---------------------------------------------------------------- state

fn sample_cache() -> KvCells {
    let mut kv = KvCells::new(16, 3).unwrap();
    decode(&mut kv, &range(0, 4), &vec![vec![0, 2]; 4]);
    decode(&mut kv, &range(4, 7), &one_seq(3, 0));
    decode(&mut kv, &range(4, 6), &one_seq(2, 1));
    kv.seq_rm(0, 5, 6).unwrap();
    kv
}

#[test]
fn whole_state_round_trip() {
    let kv = sample_cache();
    let meta = kv.state_write(None).unwrap();
    assert_eq!(meta.cells, vec![0, 1, 2, 3, 4, 6, 7, 8]);
    assert_eq!(&meta.bytes[..8], &[1, 0, 0, 0, 8, 0, 0, 0]);
    let mut data = meta.bytes.clone();
    data.extend_from_slice(b"K/V rows follow");
    let mut other = KvCells::new(16, 3).unwrap();
    decode_seq0(&mut other, &range(0, 12));
    let read = other.state_read(&data, None).unwrap();
    assert_eq!(read.consumed, meta.bytes.len());
    assert_eq!(read.cells, (0..8).collect::<Vec<u32>>());
    let live: Vec<_> = kv.cells().into_iter().filter(|c| c.0 >= 0).collect();
    assert_eq!(other.cells()[..8].to_vec(), live);
    assert_eq!((other.used(), other.head()), (8, 0));
    for s in 0..3 {
        assert_eq!(other.seq_pos_min(s), kv.seq_pos_min(s));
        assert_eq!(other.seq_pos_max(s), kv.seq_pos_max(s));
    }
    // cells are packed from 0, so a second round trip is byte-identical
    assert_eq!(other.state_write(None).unwrap().bytes, meta.bytes);
}

#[test]
fn sequence_state_moves_to_another_id() {
    let kv = sample_cache();
    let meta = kv.state_write(Some(0)).unwrap();
    assert_eq!(meta.cells, vec![0, 1, 2, 3, 4, 6]);
    let mut other = KvCells::new(8, 3).unwrap();
    decode(&mut other, &[0, 1], &one_seq(2, 1));
    let read = other.state_read(&meta.bytes, Some(2)).unwrap();
    assert_eq!(read.cells, vec![2, 3, 4, 5, 6, 7]);
    assert_eq!(read.consumed, meta.bytes.len());
    assert_eq!(
        other.cells()[2..].iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 6]
    );
    assert!(other.cells()[2..].iter().all(|c| c.1 == vec![2]));
    // restoring again replaces the sequence (its cells are freed first)
    let again = other.state_read(&meta.bytes, Some(2)).unwrap();
    assert_eq!(again.cells, vec![2, 3, 4, 5, 6, 7]);
    assert_eq!(other.used(), 8);
    assert!(other.state_write(Some(3)).is_err());
}

#[test]
fn sequence_state_skips_cells_outside_the_window() {
    let mut kv = KvCells::with_swa(16, 1, SwaParams::standard(4)).unwrap();
    decode_seq0(&mut kv, &range(0, 10));
    // hidden from the last position 9: positions <= 5
    assert_eq!(kv.state_write(Some(0)).unwrap().cells, vec![6, 7, 8, 9]);
    assert_eq!(kv.state_write(None).unwrap().cells.len(), 10);
}

#[test]
fn empty_sequence_state_leaves_the_destination() {
    let kv = sample_cache();
    let meta = kv.state_write(Some(1)).unwrap();
    assert_eq!(meta.cells.len(), 2);
    let empty = KvCells::new(16, 3).unwrap().state_write(Some(1)).unwrap();
    assert_eq!(empty.bytes, vec![1, 0, 0, 0, 0, 0, 0, 0]);
    let mut target = sample_cache();
    let read = target.state_read(&empty.bytes, Some(0)).unwrap();
    assert_eq!(
        read,
        StateRead {
            cells: vec![],
            consumed: 8
        }
    );
    assert_eq!(target.cells(), sample_cache().cells());
    // the same empty input as a whole state clears the cache
    target.state_read(&empty.bytes, None).unwrap();
    assert_eq!(target.used(), 0);
}

#[test]
fn sequence_state_without_room_changes_nothing() {
    let src = {
        let mut kv = KvCells::new(8, 2).unwrap();
        decode_seq0(&mut kv, &range(0, 5));
        kv
    };
    let meta = src.state_write(Some(0)).unwrap();
    let mut target = KvCells::new(8, 2).unwrap();
    decode(&mut target, &range(0, 2), &one_seq(2, 0));
    decode(&mut target, &range(0, 4), &one_seq(4, 1));
    let before = (target.cells(), target.head());
    assert_eq!(before.1, 6);
    // seq 0 frees 2 cells, 2 more are empty: 4 < 5
    let err = target.state_read(&meta.bytes, Some(0)).unwrap_err();
    assert_eq!(
        err,
        KvError::NoSlot {
            ubatch: 0,
            n_tokens: 5
        }
    );
    assert_eq!((target.cells(), target.head()), before);
    // seq 1 frees 4 cells (head lowered to 2), so 5 fit from cell 2 on
    let read = target.state_read(&meta.bytes, Some(1)).unwrap();
    assert_eq!(read.cells, vec![2, 3, 4, 5, 6]);
    assert_eq!(target.head(), 7);
    assert_eq!(
        (
            target.seq_pos_min(1).unwrap(),
            target.seq_pos_max(1).unwrap()
        ),
        (0, 4)
    );
    assert_eq!(target.seq_pos_max(0).unwrap(), 1);
}

fn meta_bytes(n_stream: u32, cells: &[(Pos, &[SeqId])], n_decl: Option<u32>) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&n_stream.to_le_bytes());
    b.extend_from_slice(&n_decl.unwrap_or(cells.len() as u32).to_le_bytes());
    for (pos, ids) in cells {
        b.extend_from_slice(&pos.to_le_bytes());
        b.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in *ids {
            b.extend_from_slice(&id.to_le_bytes());
        }
    }
    b
}

#[test]
fn corrupt_state_is_refused_and_changes_nothing() {
    let good = meta_bytes(1, &[(0, &[0]), (1, &[0, 1])], None);
    let mut probe = KvCells::new(4, 2).unwrap();
    assert_eq!(probe.state_read(&good, None).unwrap().cells, vec![0, 1]);

    let mut huge_n_seq = meta_bytes(1, &[(0, &[0])], None);
    huge_n_seq[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, Option<SeqId>)> = vec![
        ("empty input", vec![], None),
        ("truncated header", vec![1, 0, 0], None),
        ("truncated cell", good[..good.len() - 1].to_vec(), None),
        ("two streams", meta_bytes(2, &[(0, &[0])], None), None),
        (
            "more cells than the cache",
            meta_bytes(1, &[], Some(5)),
            None,
        ),
        (
            "declared cells missing",
            meta_bytes(1, &[(0, &[0])], Some(3)),
            None,
        ),
        ("huge n_seq_id", huge_n_seq, None),
        (
            "seq id out of range",
            meta_bytes(1, &[(0, &[2])], None),
            None,
        ),
        ("negative seq id", meta_bytes(1, &[(0, &[-1])], None), None),
        (
            "repeated seq id",
            meta_bytes(1, &[(0, &[1, 1])], None),
            None,
        ),
        (
            "negative position",
            meta_bytes(1, &[(-1, &[0])], None),
            None,
        ),
        (
            "two ids in a sequence state",
            meta_bytes(1, &[(0, &[0, 1])], Some(1)),
            Some(1),
        ),
        (
            "no id in a sequence state",
            meta_bytes(1, &[(0, &[])], None),
            Some(0),
        ),
    ];
    let mut kv = KvCells::new(4, 2).unwrap();
    decode(&mut kv, &[0, 1], &[vec![0], vec![1]]);
    let before = (kv.cells(), kv.head(), kv.used());
    for (what, bytes, dest) in cases {
        let err = kv.state_read(&bytes, dest).unwrap_err();
        assert!(matches!(err, KvError::InvalidState(_)), "{what}: {err:?}");
        assert_eq!((kv.cells(), kv.head(), kv.used()), before, "{what}");
    }
    assert_eq!(
        kv.state_read(&good, Some(2)).unwrap_err(),
        KvError::InvalidSeqId {
            seq_id: 2,
            n_seq_max: 2
        }
    );
}

#[test]
fn fast_mask_matches_the_definition() {
    // a cache with holes, shared cells, several sequences, shifted and repeated positions
    let mut kv = KvCells::new(48, 3).unwrap();
    decode(&mut kv, &range(0, 10), &vec![vec![0, 1]; 10]);
    decode(
        &mut kv,
        &range(10, 30),
        &(0..20).map(|k| vec![k % 3]).collect::<Vec<_>>(),
    );
    kv.seq_rm(1, 3, 6).unwrap();
    kv.seq_rm(-1, 12, 14).unwrap();
    kv.seq_div(2, 10, -1, 2).unwrap();
    decode(
        &mut kv,
        &[20, 21, 9, 30],
        &[vec![0], vec![0, 2], vec![2], vec![1]],
    );
    let windows = [
        SwaParams::NONE,
        SwaParams::standard(1),
        SwaParams::standard(5),
        SwaParams {
            n_swa: 4,
            kind: SwaType::Chunked,
        },
        SwaParams {
            n_swa: 6,
            kind: SwaType::Symmetric,
        },
    ];
    let pos = [0, 5, 9, 12, 20, 21, 30, 31, 40];
    let seqs: Vec<Vec<SeqId>> = (0..pos.len()).map(|k| vec![(k % 3) as SeqId, 2]).collect();
    let ub = UBatchView::new(&pos, &seqs);
    for n_kv in [kv.n_kv_window(), 33] {
        for swa in windows {
            for causal in [true, false] {
                let mut out = vec![0.0; pos.len() * n_kv as usize];
                kv.fill_mask_with(&ub, n_kv, causal, swa, &mut out).unwrap();
                for (i, row) in out.chunks(n_kv as usize).enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        let want = kv.mask_value(j, seqs[i][0], pos[i], causal, swa);
                        assert_eq!(v, want, "token {i} cell {j} {swa:?} causal {causal}");
                    }
                }
                let seen = out.iter().filter(|&&v| v == 0.0).count();
                assert!(seen > 0, "{swa:?} {causal}: some cell is visible");
            }
        }
    }
}

// ---------------------------------------------------------------- 2-D positions (M-RoPE)

/// Text positions 0..3 (2-D position = the position, as llama.cpp's M-RoPE text ubatch gives),
/// then a 3x2 image (3 wide, 2 high) at position 3 with x = 3 + column, y = 3 + row, as mtmd
/// places an image after 3 tokens, then text at 6 (n_pos of the image: max(3, 2)).
fn image_cache() -> (KvCells, Vec<CellExt>) {
    let mut kv = KvCells::new(16, 2).unwrap().with_2d_positions();
    let text = |p: Pos| CellExt { x: p, y: p };
    let image: Vec<CellExt> = (0..6).map(|i| CellExt { x: 3 + i % 3, y: 3 + i / 3 }).collect();
    for (pos, ext) in [(range(0, 3), (0..3).map(text).collect::<Vec<_>>()), (vec![3; 6], image.clone()), (vec![6], vec![text(6)])] {
        let seqs = one_seq(pos.len(), 0);
        let ub = UBatchView::new(&pos, &seqs).with_ext(&ext);
        let slots = kv.prepare(&[ub]).unwrap().remove(0);
        kv.apply_ubatch(&slots, &ub).unwrap();
    }
    (kv, image)
}

fn mask_rows_2d(kv: &KvCells, pos: &[Pos], ext: &[CellExt], causal: bool) -> Vec<Vec<usize>> {
    let seqs = one_seq(pos.len(), 0);
    let ub = UBatchView::new(pos, &seqs).with_ext(ext);
    let n_kv = kv.size() as usize;
    let mut out = vec![1.0; pos.len() * n_kv];
    kv.fill_mask(&ub, n_kv as u32, causal, &mut out).unwrap();
    out.chunks(n_kv).map(visible).collect()
}

#[test]
fn image_tokens_of_one_position_see_each_other_in_raster_order() {
    let (kv, image) = image_cache();
    assert_eq!(kv.ext_of(4), CellExt { x: 4, y: 3 });
    assert_eq!(kv.ext_of(9), CellExt { x: 6, y: 6 });
    let rows = mask_rows_2d(&kv, &[3; 6], &image, true);
    // cells 3..9 hold the image in raster order: each token sees the text and the image up to itself
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(*row, (0..4 + i).collect::<Vec<_>>(), "image token {i}");
    }
    // non-causal: the whole image (and the text after it, which the sequence holds too)
    assert_eq!(mask_rows_2d(&kv, &[3], &image[..1], false)[0], (0..10).collect::<Vec<_>>());
    // the text after the image sees everything before it
    assert_eq!(mask_rows_2d(&kv, &[7], &[CellExt { x: 7, y: 7 }], true)[0], (0..10).collect::<Vec<_>>());
    // without 2-D positions the micro-batch is masked by position alone
    assert_eq!(visible(&mask_row(&kv, 3, &[0], true, None)), (0..9).collect::<Vec<_>>());
}

#[test]
fn two_d_positions_survive_sequence_operations_defrag_and_state() {
    let (mut kv, image) = image_cache();
    let exts = |kv: &KvCells, cells: &[u32]| cells.iter().map(|&c| kv.ext_of(c)).collect::<Vec<_>>();
    kv.seq_cp(0, 1, -1, -1).unwrap();
    kv.seq_rm(0, 0, 2).unwrap();
    kv.seq_rm(1, 0, 2).unwrap();
    let plan = kv.defrag_plan(u32::MAX);
    kv.apply_defrag(&plan).unwrap();
    let image_cells: Vec<u32> = (0..kv.size()).filter(|&c| kv.pos_of(c) == 3).collect();
    let raster = |e: &[CellExt]| e.iter().map(|e| (e.y, e.x)).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(raster(&exts(&kv, &image_cells)), raster(&image));
    // the whole state and one sequence's carry them
    let meta = kv.state_write(None).unwrap();
    let mut whole = KvCells::new(16, 2).unwrap().with_2d_positions();
    let read = whole.state_read(&meta.bytes, None).unwrap();
    assert_eq!(exts(&whole, &read.cells), exts(&kv, &meta.cells));
    let seq = kv.state_write(Some(1)).unwrap();
    let mut other = KvCells::new(16, 2).unwrap().with_2d_positions();
    decode(&mut other, &[0, 1], &one_seq(2, 1));
    let read = other.state_read(&seq.bytes, Some(0)).unwrap();
    assert_eq!(read.consumed, seq.bytes.len());
    assert_eq!(exts(&other, &read.cells), exts(&kv, &seq.cells));
    // per cell: position, id count, x and y, the two ids
    assert_eq!(meta.cells.len(), 8);
    assert_eq!(meta.bytes.len(), 8 + 8 * (4 + 4 + 8 + 2 * 4));
}

#[test]
fn two_d_positions_must_be_one_per_token() {
    let kv = KvCells::new(4, 1).unwrap().with_2d_positions();
    let seqs = one_seq(2, 0);
    let ext = [CellExt::default()];
    let ub = UBatchView::new(&[0, 1], &seqs).with_ext(&ext);
    assert_eq!(kv.find_slot(&ub).unwrap_err(), KvError::ExtShape { n_pos: 2, n_ext: 1 });
}
