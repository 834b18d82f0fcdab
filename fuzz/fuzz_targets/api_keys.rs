//! `RUNLEASE_API_KEYS` (`role:key[:queue|queue]`, comma-separated) and the
//! bearer keys callers send: `ApiKeys::parse` on any text, then `lookup`.
//!
//! Invariants: a spec that parses gives each of its entries' keys the
//! entry's role and queue list; every key is at least 16 characters; a
//! bearer key that is not one of the entries' keys is unknown.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use runlease_coordinator::auth::ApiKeys;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(keys) = ApiKeys::parse(text) else {
        return;
    };
    let entries: Vec<&str> = text.split(',').map(str::trim).filter(|e| !e.is_empty()).collect();
    assert_eq!(keys.is_empty(), entries.is_empty());
    let mut known = HashSet::new();
    for entry in entries {
        let mut parts = entry.splitn(3, ':');
        let (role, key, queues) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next(),
        );
        assert!(key.len() >= 16, "{entry:?}");
        let caller = keys
            .lookup(key)
            .unwrap_or_else(|| panic!("{entry:?}: its key is unknown"));
        assert_eq!(caller.role.as_str(), role, "{entry:?}");
        let expected = queues.map(|list| list.split('|').map(str::to_owned).collect::<HashSet<_>>());
        assert_eq!(caller.queues, expected, "{entry:?}");
        known.insert(key);
    }
    // Any other text is unknown: each entry's key with a byte more or less.
    for key in &known {
        let mut shorter = (*key).to_owned();
        shorter.pop();
        for other in [format!("{key} "), shorter] {
            if !known.contains(other.as_str()) {
                assert!(keys.lookup(&other).is_none(), "{other:?}");
            }
        }
    }
});
