//! Fuzzing config loading with proptest: a links file of any text never panics the loader, its
//! errors name a line or say what is wrong, and an accepted file survives `to_yaml` and back.
//! `PROPTEST_CASES` sets the number of cases (`make e2e` runs 20,000).

use floodgate_link_crd::LinksFile;
use proptest::prelude::*;

/// Text shaped like a links file: known keys, odd values, broken indentation.
fn yamlish() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        Just("links:".to_owned()),
        Just("- name: east".to_owned()),
        "- name: [a-zA-Z0-9-]{0,8}".prop_map(String::from),
        Just("  spec:".to_owned()),
        Just("    remote:".to_owned()),
        "      kubeconfigPath: [a-z/]{0,8}".prop_map(String::from),
        "    coalesce: \\{quiet: [0-9a-z]{0,4}, max: [0-9a-z]{0,4}\\}".prop_map(String::from),
        "    caps: \\{maxEndpointsPerService: -?[0-9]{0,6}\\}".prop_map(String::from),
        "    rateLimit: \\{perLink: \\{updatesPerSecond: [0-9]{0,3}, burst: [0-9]{0,3}\\}\\}"
            .prop_map(String::from),
        "    select: \\{services: \\{matchLabels: \\{[a-z/.]{0,6}: [a-z]{0,3}\\}\\}\\}"
            .prop_map(String::from),
        "[ :\\-\\[\\]{}a-z0-9]{0,16}".prop_map(String::from),
    ];
    proptest::collection::vec(line, 0..12).prop_map(|l| l.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn fuzz_links_files_never_panic_and_round_trip(src in prop_oneof![yamlish(), any::<String>()]) {
        match LinksFile::from_yaml(&src) {
            Ok(file) => {
                let yaml = file.to_yaml().map_err(|e| TestCaseError::fail(e.to_string()))?;
                let again = LinksFile::from_yaml(&yaml)
                    .map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
                prop_assert_eq!(again, file);
            }
            Err(e) => prop_assert!(!e.to_string().trim().is_empty(), "an empty error for {:?}", src),
        }
    }
}
