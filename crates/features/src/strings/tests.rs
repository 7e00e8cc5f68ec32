//! Unit tests of `strings`.

use super::*;

#[test]
fn a_value_is_stored_once_and_dropped_with_its_last_row() {
    let mut c = StrColumn::default();
    c.set(0, Some("DE"));
    c.set(1, Some("US"));
    c.set(2, Some("DE"));
    c.set(5, None);
    assert_eq!(c.distinct(), 2);
    assert_eq!(
        (0..7).map(|s| c.get(s)).collect::<Vec<_>>(),
        [Some("DE"), Some("US"), Some("DE"), None, None, None, None]
    );
    c.set(0, Some("FR"));
    assert_eq!(c.distinct(), 3);
    c.set(2, None);
    // The last "DE" is gone: its number goes to the next new value.
    assert_eq!(c.distinct(), 2);
    c.set(3, Some("IT"));
    assert_eq!(c.values.sizes().0, 3);
    assert_eq!(c.get(3), Some("IT"));
    assert_eq!(c.get(0), Some("FR"));
    assert_eq!(c.get(1), Some("US"));
    c.set(1, Some("US"));
    assert_eq!(c.refs[c.codes[1] as usize], 1);
}

#[test]
fn removed_strings_are_compacted_away() {
    let mut c = StrColumn::default();
    let name = |i: usize| format!("place number {i:08}");
    let rows = 200_000;
    for s in 0..rows {
        c.set(s, Some(&name(s)));
    }
    let full = c.values.sizes().1;
    for s in (0..rows).filter(|s| s % 4 != 0) {
        c.set(s, None);
    }
    let (live, bytes) = c.values.sizes();
    assert_eq!(live, rows / 4);
    assert!(bytes < full / 2, "{bytes} of {full} bytes kept");
    for s in 0..rows {
        assert_eq!(c.get(s), (s % 4 == 0).then(|| name(s)).as_deref());
    }
}

#[test]
fn a_column_read_back_finds_its_values_and_keeps_counting_new_ones() {
    let mut w = Vec::new();
    SortedStrings::encode(&["DE", "FR", "US"], &mut w);
    let codes_at = w.len();
    w.extend_from_slice(bytemuck::cast_slice(&[0u32, 2, 0, NULL, 2]));
    let map = crate::paged::mapped_for_test(&w);
    let (values, at) = SortedStrings::read(&map, 0).unwrap();
    assert_eq!(at, codes_at);
    let codes = Paged::mapped(&map, codes_at, 5).unwrap();
    let mut c = StrColumn::from_saved(values, codes).unwrap();
    assert_eq!(
        (0..6).map(|s| c.get(s)).collect::<Vec<_>>(),
        [Some("DE"), Some("US"), Some("DE"), None, Some("US"), None]
    );
    // A saved value given to another row is found, not added; a new one is added and
    // dropped with its last row.
    c.set(3, Some("FR"));
    c.set(5, Some("IT"));
    c.set(6, Some("IT"));
    assert_eq!(c.distinct(), 1);
    assert_eq!(
        (c.code(3), c.code(5), c.code(6)),
        (Some(1), Some(3), Some(3))
    );
    c.set(5, None);
    c.set(6, Some("US"));
    assert_eq!(c.distinct(), 0);
    assert_eq!(
        (0..7).map(|s| c.get(s)).collect::<Vec<_>>(),
        [
            Some("DE"),
            Some("US"),
            Some("DE"),
            Some("FR"),
            Some("US"),
            None,
            Some("US")
        ]
    );
    // A number past the saved values is refused.
    let mut bad = w.clone();
    bad[codes_at..codes_at + 4].copy_from_slice(&3u32.to_le_bytes());
    let map2 = crate::paged::mapped_for_test(&bad);
    let (values, _) = SortedStrings::read(&map2, 0).unwrap();
    let codes = Paged::mapped(&map2, codes_at, 5).unwrap();
    assert!(StrColumn::from_saved(values, codes).is_err());
}

/// A saved view's documents and their rows, as [`UriBlocks`], with `extra` added after.
#[test]
fn saved_documents_are_found_moved_and_removed_as_added_ones_are() {
    use std::collections::BTreeMap;
    // 1000 documents, some with two rows, in URI order, in blocks.
    let mut oracle: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut next = 0u32;
    let mut uris: Vec<String> = (0..1000).map(|i| format!("/d/{i}.json")).collect();
    uris.sort();
    let mut listed = Vec::new();
    for (i, u) in uris.iter().enumerate() {
        let rows = 1 + u32::from(i % 7 == 0);
        oracle.insert(u.clone(), (next..next + rows).collect());
        listed.push((u.clone(), rows));
        next += rows;
    }
    let mut w = Vec::new();
    UriBlocks::encode(
        listed.iter().map(|(u, n)| ([u.as_bytes(), &b""[..]], *n)),
        &mut w,
    );
    let map = crate::paged::mapped_for_test(&w);
    let (blocks, end) = UriBlocks::read(&map, 0).unwrap();
    assert_eq!((end, blocks.len()), (w.len(), 1000));
    let mut d = DocIndex::from_saved(blocks);
    let check = |d: &DocIndex, oracle: &BTreeMap<String, Vec<u32>>| {
        for u in uris
            .iter()
            .chain(["/d/x.json".to_string(), "/".to_string()].iter())
        {
            let want: &[u32] = oracle.get(u).map_or(&[], |v| v);
            assert_eq!(&*d.get(u), want, "{u}");
        }
        let mut all = d.iter();
        all.sort();
        let want: Vec<(String, Vec<u32>)> =
            oracle.iter().map(|(u, s)| (u.clone(), s.clone())).collect();
        assert_eq!(all, want);
        assert_eq!(d.len(), oracle.len());
        // Listed in ranges of numbers and sorted: every document once, with its tag.
        let mut list = DocList::default();
        let numbers = d.numbers();
        for from in (0..numbers).step_by(97) {
            d.copy_range(from..from + 97, |s| s.len() as u8, &mut list);
        }
        list.sort();
        let got: Vec<(String, Vec<u32>)> = list
            .iter()
            .map(|(u, t, s)| {
                assert_eq!(t as usize, s.len());
                (u.to_string(), s.to_vec())
            })
            .collect();
        assert_eq!(got, want);
    };
    check(&d, &oracle);
    // Moved (new rows), removed, removed and added again, and new.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for k in 0..600u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = if x.is_multiple_of(4) {
            format!("/e/{}.json", x % 50)
        } else {
            uris[(x % 1000) as usize].clone()
        };
        if x.is_multiple_of(3) {
            let had = oracle.remove(&u).unwrap_or_default();
            assert_eq!(d.remove(&u), had, "{u}");
        } else {
            let slots = vec![5000 + k];
            let had = oracle.insert(u.clone(), slots.clone()).is_some();
            assert_eq!(d.set(&u, &slots), !had, "{u}");
        }
    }
    check(&d, &oracle);
}

#[test]
fn a_long_string_is_kept_outside_the_arena() {
    let mut s = Strings::default();
    let long = "x".repeat(OUTSIDE as usize + 5);
    let a = s.push("a");
    let b = s.push(&long);
    assert_eq!((s.get(a), s.get(b)), ("a", long.as_str()));
    s.remove(b);
    assert!(s.outside.is_empty());
    assert_eq!(s.push("c"), b);
    assert_eq!(s.get(b), "c");
}

#[test]
fn documents_keep_one_slot_or_many() {
    let mut d = DocIndex::default();
    d.set("/a.json", &[3]);
    d.set("/b.json", &[4, 7]);
    d.set("/c.json", &[(1 << 31) + 1]);
    assert_eq!(*d.get("/a.json"), [3]);
    assert_eq!(*d.get("/b.json"), [4, 7]);
    assert_eq!(*d.get("/c.json"), [(1 << 31) + 1]);
    assert_eq!(*d.get("/z.json"), [] as [u32; 0]);
    d.set("/a.json", &[3, 9]);
    assert_eq!(d.remove("/b.json"), [4, 7]);
    d.set("/b.json", &[5]);
    let mut all: Vec<(String, Vec<u32>)> = d.iter();
    all.sort();
    assert_eq!(
        all,
        [
            ("/a.json".to_string(), vec![3, 9]),
            ("/b.json".to_string(), vec![5]),
            ("/c.json".to_string(), vec![(1 << 31) + 1]),
        ]
    );
    d.set("/a.json", &[]);
    assert_eq!(d.len(), 2);
    assert_eq!(d.many_free.len(), 2);
}

#[test]
fn uris_share_directories_and_sort_as_the_store_does() {
    let mut d = DocIndex::default();
    // 300 directories: past the 255 shared, URIs are kept whole.
    let mut uris: Vec<String> = (0..300)
        .flat_map(|i| {
            [
                format!("/dir{i}/a.json"),
                format!("/dir{i}/b/c.json"),
                format!("/dir{i}/"),
            ]
        })
        .collect();
    uris.extend(["plain".to_string(), "/".to_string(), "".to_string()]);
    uris.push("/dir1/a.json/".to_string());
    uris.push("/dir1-a.json".to_string());
    for (i, u) in uris.iter().enumerate() {
        d.set(u, &[i as u32]);
    }
    assert_eq!(d.directories.len(), MAX_DIRECTORIES);
    for (i, u) in uris.iter().enumerate() {
        assert_eq!(*d.get(u), [i as u32], "{u}");
    }
    assert_eq!(*d.get("/dir1/"), [5]);
    assert_eq!(*d.get("/dir1"), [] as [u32; 0]);
    assert_eq!(*d.get("/dir299/a.jso"), [] as [u32; 0]);
    let mut listed = d.iter();
    listed.sort();
    let mut sorted = uris.clone();
    sorted.sort();
    let listed: Vec<String> = listed.into_iter().map(|(u, _)| u).collect();
    assert_eq!(listed, sorted);
    for u in &uris[..450] {
        assert_eq!(d.remove(u).len(), 1);
    }
    assert_eq!(d.len(), uris.len() - 450);
    assert_eq!(*d.get(&uris[451]), [451]);
}

#[test]
fn a_list_copied_in_ranges_is_in_uri_order_with_each_document_once() {
    let mut d = DocIndex::default();
    // Directories shared and not, URIs without one, prefixes of others, a NUL byte, and
    // many that differ only past their first eight bytes after the common prefix.
    let mut uris: Vec<String> = (0..300)
        .flat_map(|i| [format!("/dir{i}/a.json"), format!("/dir{i}/")])
        .collect();
    uris.extend((0..500).map(|i| format!("/places/0/12345678{i}.json")));
    uris.extend(
        [
            "plain",
            "/",
            "",
            "/dir1/a.json/",
            "/dir1-a.json",
            "/dir1/a\0",
        ]
        .map(String::from),
    );
    for (i, u) in uris.iter().enumerate() {
        d.set(u, &[i as u32, 10_000 + i as u32]);
    }
    let tag = |slots: &[u32]| (slots[0] % 251) as u8;
    let mut list = DocList::default();
    list.reserve((10, 10, 10));
    let n = d.numbers();
    for from in (0..n).step_by(7) {
        d.copy_range(from..from + 7, tag, &mut list);
    }
    // A document removed and added again between two copies is copied twice.
    d.copy_range(3..4, tag, &mut list);
    list.sort();
    let mut want = uris.clone();
    want.sort();
    let got: Vec<String> = list.iter().map(|(u, _, _)| u.to_string()).collect();
    assert_eq!(got, want);
    for (u, t, slots) in list.iter() {
        let i = uris.iter().position(|x| *x == u.to_string()).unwrap() as u32;
        assert_eq!(slots, [i, 10_000 + i], "{u}");
        assert_eq!(t, (i % 251) as u8);
    }
    // Removed documents are not copied.
    for u in &uris[..100] {
        d.remove(u);
    }
    let mut list = DocList::default();
    d.copy_range(0..d.numbers(), tag, &mut list);
    list.sort();
    assert_eq!(list.iter().len(), uris.len() - 100);
    assert!(DocList::default().iter().next().is_none());
}
