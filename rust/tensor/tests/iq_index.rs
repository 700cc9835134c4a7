//! The grid indices of `scalar::iq_index` against ggml's own: FNV-1a 64 digests of the
//! kgrid_q2xs / kmap_q2xs / kneighbors_q2xs arrays iq2xs_init_impl builds in llama-cpp-python
//! 0.3.36's libggml-base.so, read from its memory by tests/gen_iq_index_digest.py.

use ferrollama_tensor::scalar::iq_index::{grid_index, Iq2Grid, KMAP_SIZE};
use Iq2Grid::{Iq1 as IQ1, S, Xs as XS, Xxs as XXS};

/// (grid, digest of the grid, of the map, neighbour list length, digest of the lists).
const GGML: [(Iq2Grid, u64, u64, usize, u64); 4] = [
    (XXS, 0x2e7a6071bba80155, 0xc9aaccb2f398af07, 417400, 0xa75bd9e2420d5d13),
    (XS, 0x7c14724affc4cc7d, 0xb38ddb443a8784b1, 551722, 0xa7d0f454a49b36e7),
    (S, 0x785c45bdf95d1b49, 0x6197b6f9100d06db, 209100, 0x663036b82366cac0),
    (IQ1, 0x5f11afdd44abc217, 0xd020080b4c7cb7af, 1375339, 0x3582afeead46ff16),
];

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

#[test]
fn grid_indices_are_ggmls() {
    for (g, grid, map, len, neighbours) in GGML {
        let index = grid_index(g);
        assert_eq!(index.map.len(), KMAP_SIZE);
        assert_eq!(fnv1a(index.grid.iter().flat_map(|p| p.to_le_bytes())), grid, "{g:?} grid");
        assert_eq!(fnv1a(index.map.iter().flat_map(|m| m.to_le_bytes())), map, "{g:?} map");
        assert_eq!(index.neighbours.len(), len, "{g:?} neighbour count");
        assert_eq!(fnv1a(index.neighbours.iter().flat_map(|n| n.to_le_bytes())), neighbours, "{g:?} neighbours");
    }
}

#[test]
fn one_index_per_grid_shared_across_threads() {
    let addrs: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2).map(|_| s.spawn(|| grid_index(S) as *const _ as usize)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(addrs[0], addrs[1]);
    assert_eq!(addrs[0], grid_index(S) as *const _ as usize);
}
