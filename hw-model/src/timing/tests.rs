use super::*;

#[test]
fn lru_evicts_the_least_recently_used() {
    let mut cache = LruCache::new(2);
    assert!(!cache.touch(1));
    assert!(!cache.touch(2));
    assert!(cache.touch(1));
    assert!(!cache.touch(3)); // evicts 2
    assert!(cache.touch(1));
    assert!(!cache.touch(2));
    assert_eq!(cache.len(), 2);
    // A cyclic pattern one larger than the cache always misses.
    let mut cache = LruCache::new(4);
    let misses = (0..100u32).filter(|i| !cache.touch(i % 5)).count();
    assert_eq!(misses, 100);
}

#[test]
fn presets_parse_and_override() {
    assert_eq!(TimingParams::preset("hns-100g").unwrap(), TimingParams::default());
    assert_eq!(TimingParams::preset("hns-25g").unwrap().link_gbps, 25);
    assert!(TimingParams::preset("nope").is_err());
    let p = TimingParams::from_toml("preset = \"hns-25g\"\npcie_lanes = 4\n").unwrap();
    assert_eq!((p.link_gbps, p.pcie_lanes), (25, 4));
    assert!(TimingParams::from_toml("no_such = 1").is_err());
    let mut p = TimingParams::ideal();
    p.set("mtt_cache_entries=8").unwrap();
    assert_eq!(p.mtt_cache_entries, 8);
    assert!(p.set("clock_mhz = 0").is_err());
}

#[test]
fn costs_follow_the_parameters() {
    let p = TimingParams::hns_100g();
    // 100 Gb/s: 80 ps per byte; a 64-byte frame is 88 bytes on the wire.
    assert_eq!(p.serialisation(64), Picoseconds(88 * 80));
    // Gen3 x16: 8 GT/s × 128/130 × 16 lanes; 130 000 bytes take 8 × 130 000 × 130 × 10 000 /
    // (128 × 80 × 16) ps.
    assert_eq!(
        p.pcie_bytes_time(128 * 16).0,
        (128 * 16 * 8 * 130 * 10_000u64).div_ceil(128 * 80 * 16)
    );
    assert_eq!(p.pcie_tlp_bytes(4096, 256), 4096 + 16 * 24);
    assert_eq!(p.cycles(100), Picoseconds::from_nanos(200));
    let ideal = TimingParams::ideal();
    assert_eq!(ideal.wqe_fetch(), Picoseconds::ZERO);
    assert_eq!(ideal.mtt_miss(3), Picoseconds::ZERO);
    assert_eq!(ideal.cqe_write(), Picoseconds::ZERO);
}

#[test]
fn mtt_lookups_cost_what_the_parameters_say() {
    // The model works the hit and per-level walk costs out once; every lookup must still
    // charge exactly `mtt_hit()` or `mtt_miss(levels)`, for any preset and level count.
    for preset in PRESETS {
        let mut params = TimingParams::preset(preset).unwrap();
        params.set("mtt_cache_entries = 2").unwrap();
        let mut model = TimingModel::new(params);
        for levels in [0, 1, 2, 3] {
            let root = u64::from(levels) << 20;
            assert_eq!(model.mtt_lookup(root, 0, levels), params.mtt_miss(levels), "{preset}");
            assert_eq!(model.mtt_lookup(root, 0, levels), params.mtt_hit(), "{preset}");
        }
        assert_eq!(model.mtt_lookup(9, 9, 2), params.mtt_miss(2));
        assert_eq!((model.mtt_hits, model.mtt_misses), (4, 5));
        let totals = model.totals();
        assert_eq!(totals.count(Stage::MttHit), 4);
        assert_eq!(totals.total(Stage::MttHit).0, 4 * params.mtt_hit().0);
    }
}
