//! The Link spec as users write it: defaults, round trips, every validation rule with its path,
//! unknown fields, and the CRD's schema.

use floodgate_link_crd::{
    AutoRelease, ConfigError, KubeDuration, LinkSpec, LinksFile, RemoteSpec, SecretKeyRef, crd,
    crd_yaml, validate,
};

fn mk_spec() -> LinkSpec {
    LinkSpec::with_remote(RemoteSpec {
        kubeconfig_path: Some("/etc/floodgate/east.kubeconfig".into()),
        ..RemoteSpec::default()
    })
}

/// The paths of every error `validate` reports for `spec`.
fn error_paths(spec: &LinkSpec) -> Vec<String> {
    match validate(spec, "spec") {
        Ok(()) => vec![],
        Err(e) => e.0.into_iter().map(|e| e.path).collect(),
    }
}

#[test]
fn a_minimal_spec_gets_every_documented_default() {
    let spec: LinkSpec =
        serde_yaml::from_str("remote: {kubeconfigPath: /k}").expect("minimal spec parses");
    assert_eq!(spec.coalesce.quiet, KubeDuration::from_millis(100));
    assert_eq!(spec.coalesce.max, KubeDuration::from_secs(2));
    assert_eq!(spec.rate_limit.per_link.updates_per_second, 50);
    assert_eq!(spec.rate_limit.per_link.burst, 100);
    assert_eq!(spec.rate_limit.per_service.updates_per_second, 5);
    assert_eq!(spec.rate_limit.per_service.burst, 10);
    assert_eq!(spec.caps.max_endpoints_per_service, 1000);
    assert_eq!(spec.caps.max_services, 2000);
    assert_eq!(spec.caps.max_objects, 200_000);
    assert_eq!(spec.target_cluster_linkerd_namespace, "linkerd");
    assert_eq!(spec.quarantine.when.events_per_second, 2000);
    assert_eq!(
        spec.quarantine.when.sustained_for,
        KubeDuration::from_secs(10)
    );
    assert_eq!(spec.quarantine.when.endpoints_per_service, 20_000);
    assert_eq!(
        spec.quarantine.auto_release, None,
        "manual release unless asked"
    );
    let exprs = spec
        .select
        .services
        .match_expressions
        .expect("default selector");
    assert_eq!(exprs.len(), 1);
    assert_eq!(exprs[0].key, "mirror.linkerd.io/exported");
    assert_eq!(exprs[0].operator, "In");
    assert_eq!(
        exprs[0].values.as_deref(),
        Some(&["true".to_owned(), "remote-discovery".to_owned()][..])
    );
    assert_eq!(validate(&mk_spec(), "spec"), Ok(()));
}

#[test]
fn partial_sections_keep_defaults_for_the_fields_left_out() {
    let spec: LinkSpec = serde_yaml::from_str(
        "remote: {kubeconfigPath: /k}\nrateLimit: {perService: {updatesPerSecond: 2, burst: 3}}\nquarantine: {autoRelease: {}}",
    )
    .expect("parses");
    assert_eq!(spec.rate_limit.per_link.updates_per_second, 50);
    assert_eq!(spec.rate_limit.per_service.updates_per_second, 2);
    assert_eq!(spec.quarantine.auto_release, Some(AutoRelease::default()));
    assert_eq!(
        spec.quarantine.auto_release.map(|a| a.after),
        Some(KubeDuration::from_secs(600))
    );
}

#[test]
fn yaml_round_trips_through_the_spec() {
    let mut spec = mk_spec();
    spec.coalesce.quiet = KubeDuration::from_millis(250);
    spec.quarantine.auto_release = Some(AutoRelease {
        after: KubeDuration::from_secs(90),
        max_after: KubeDuration::from_secs(7200),
    });
    let yaml = serde_yaml::to_string(&spec).expect("serializes");
    assert!(yaml.contains("quiet: 250ms"), "{yaml}");
    assert!(yaml.contains("after: 1m30s"), "{yaml}");
    assert!(yaml.contains("maxAfter: 2h"), "{yaml}");
    let back: LinkSpec = serde_yaml::from_str(&yaml).expect("parses back");
    assert_eq!(back, spec);
    assert_eq!(serde_yaml::to_string(&back).expect("serializes"), yaml);
}

#[test]
fn unknown_fields_are_errors_with_their_place() {
    let err =
        serde_yaml::from_str::<LinkSpec>("remote: {kubeconfigPath: /k}\ncoalesce:\n  quite: 1s\n")
            .expect_err("typo must be refused");
    let msg = err.to_string();
    assert!(msg.contains("unknown field `quite`"), "{msg}");
    assert!(msg.contains("line 3"), "{msg}");
}

/// A change that breaks one rule.
type Mutation = Box<dyn Fn(&mut LinkSpec)>;

#[test]
fn every_validation_rule_reports_its_path() {
    let cases: Vec<(&str, Mutation, &str)> = vec![
        (
            "no remote",
            Box::new(|s| s.remote = RemoteSpec::default()),
            "spec.remote",
        ),
        (
            "a Linkerd namespace that is no DNS-1123 label",
            Box::new(|s| s.target_cluster_linkerd_namespace = "Linkerd.Prod".into()),
            "spec.targetClusterLinkerdNamespace",
        ),
        (
            "two remotes",
            Box::new(|s| {
                s.remote.kubeconfig_secret = Some(SecretKeyRef {
                    name: "creds".into(),
                    key: "kubeconfig".into(),
                })
            }),
            "spec.remote",
        ),
        (
            "bad secret name",
            Box::new(|s| {
                s.remote = RemoteSpec {
                    kubeconfig_secret: Some(SecretKeyRef {
                        name: "Not_A_Name".into(),
                        key: "k".into(),
                    }),
                    ..RemoteSpec::default()
                }
            }),
            "spec.remote.kubeconfigSecret.name",
        ),
        (
            "empty secret key",
            Box::new(|s| {
                s.remote = RemoteSpec {
                    kubeconfig_secret: Some(SecretKeyRef {
                        name: "creds".into(),
                        key: String::new(),
                    }),
                    ..RemoteSpec::default()
                }
            }),
            "spec.remote.kubeconfigSecret.key",
        ),
        (
            "empty path",
            Box::new(|s| s.remote.kubeconfig_path = Some(String::new())),
            "spec.remote.kubeconfigPath",
        ),
        (
            "empty context",
            Box::new(|s| s.remote.context = Some(String::new())),
            "spec.remote.context",
        ),
        (
            "zero max",
            Box::new(|s| {
                s.coalesce.max = KubeDuration::from_secs(0);
                s.coalesce.quiet = KubeDuration::from_secs(0);
            }),
            "spec.coalesce.max",
        ),
        (
            "quiet > max",
            Box::new(|s| s.coalesce.quiet = KubeDuration::from_secs(3)),
            "spec.coalesce.quiet",
        ),
        (
            "zero link rate",
            Box::new(|s| s.rate_limit.per_link.updates_per_second = 0),
            "spec.rateLimit.perLink.updatesPerSecond",
        ),
        (
            "zero link burst",
            Box::new(|s| s.rate_limit.per_link.burst = 0),
            "spec.rateLimit.perLink.burst",
        ),
        (
            "zero service rate",
            Box::new(|s| s.rate_limit.per_service.updates_per_second = 0),
            "spec.rateLimit.perService.updatesPerSecond",
        ),
        (
            "zero service burst",
            Box::new(|s| s.rate_limit.per_service.burst = 0),
            "spec.rateLimit.perService.burst",
        ),
        (
            "service rate > link",
            Box::new(|s| s.rate_limit.per_service.updates_per_second = 51),
            "spec.rateLimit.perService.updatesPerSecond",
        ),
        (
            "service burst > link",
            Box::new(|s| s.rate_limit.per_service.burst = 101),
            "spec.rateLimit.perService.burst",
        ),
        (
            "zero services cap",
            Box::new(|s| s.caps.max_services = 0),
            "spec.caps.maxServices",
        ),
        (
            "zero objects cap",
            Box::new(|s| {
                s.caps.max_objects = 0;
                s.caps.max_services = 0;
            }),
            "spec.caps.maxObjects",
        ),
        (
            "services > objects",
            Box::new(|s| s.caps.max_objects = 10),
            "spec.caps.maxServices",
        ),
        (
            "zero endpoints cap",
            Box::new(|s| s.caps.max_endpoints_per_service = 0),
            "spec.caps.maxEndpointsPerService",
        ),
        (
            "zero event rate",
            Box::new(|s| s.quarantine.when.events_per_second = 0),
            "spec.quarantine.when.eventsPerSecond",
        ),
        (
            "short sustain",
            Box::new(|s| s.quarantine.when.sustained_for = KubeDuration::from_millis(500)),
            "spec.quarantine.when.sustainedFor",
        ),
        (
            "no removal share",
            Box::new(|s| s.quarantine.when.removed_share = 0),
            "spec.quarantine.when.removedShare",
        ),
        (
            "removal share over 100",
            Box::new(|s| s.quarantine.when.removed_share = 101),
            "spec.quarantine.when.removedShare",
        ),
        (
            "one service a removal",
            Box::new(|s| s.quarantine.when.removed_services = 1),
            "spec.quarantine.when.removedServices",
        ),
        (
            "short removal window",
            Box::new(|s| s.quarantine.when.removed_within = KubeDuration::from_millis(500)),
            "spec.quarantine.when.removedWithin",
        ),
        (
            "trigger under cap",
            Box::new(|s| s.quarantine.when.endpoints_per_service = 999),
            "spec.quarantine.when.endpointsPerService",
        ),
        (
            "release before sustain",
            Box::new(|s| {
                s.quarantine.auto_release = Some(AutoRelease {
                    after: KubeDuration::from_secs(5),
                    max_after: KubeDuration::from_secs(60),
                })
            }),
            "spec.quarantine.autoRelease.after",
        ),
        (
            "max before after",
            Box::new(|s| {
                s.quarantine.auto_release = Some(AutoRelease {
                    after: KubeDuration::from_secs(60),
                    max_after: KubeDuration::from_secs(30),
                })
            }),
            "spec.quarantine.autoRelease.maxAfter",
        ),
        (
            "bad selector operator",
            Box::new(|s| {
                s.select
                    .services
                    .match_expressions
                    .as_mut()
                    .expect("default")[0]
                    .operator = "Like".into()
            }),
            "spec.select.services.matchExpressions[0].operator",
        ),
        (
            "In without values",
            Box::new(|s| {
                s.select
                    .services
                    .match_expressions
                    .as_mut()
                    .expect("default")[0]
                    .values = None
            }),
            "spec.select.services.matchExpressions[0].values",
        ),
        (
            "Exists with values",
            Box::new(|s| {
                s.select
                    .services
                    .match_expressions
                    .as_mut()
                    .expect("default")[0]
                    .operator = "Exists".into()
            }),
            "spec.select.services.matchExpressions[0].values",
        ),
        (
            "bad key",
            Box::new(|s| {
                s.select
                    .services
                    .match_expressions
                    .as_mut()
                    .expect("default")[0]
                    .key = "-bad-/x".into()
            }),
            "spec.select.services.matchExpressions[0].key",
        ),
        (
            "bad value",
            Box::new(|s| {
                s.select.services.match_labels =
                    Some([("app".to_owned(), "no spaces".to_owned())].into())
            }),
            "spec.select.services.matchLabels.app",
        ),
    ];
    for (what, mutate, path) in cases {
        let mut spec = mk_spec();
        mutate(&mut spec);
        let paths = error_paths(&spec);
        assert!(
            paths.iter().any(|p| p == path),
            "{what}: expected an error at {path}, got {paths:?}"
        );
    }
}

#[test]
fn validation_reports_every_problem_at_once() {
    let mut spec = mk_spec();
    spec.rate_limit.per_link.burst = 0;
    spec.caps.max_services = 0;
    spec.coalesce.quiet = KubeDuration::from_secs(60);
    let paths = error_paths(&spec);
    for want in [
        "spec.rateLimit.perLink.burst",
        "spec.caps.maxServices",
        "spec.coalesce.quiet",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "missing {want} in {paths:?}"
        );
    }
}

const GOOD_FILE: &str = "\
links:
  - name: east
    spec:
      remote:
        kubeconfigPath: /etc/floodgate/east.kubeconfig
  - name: west
    spec:
      remote: {kubeconfigPath: /etc/floodgate/west.kubeconfig}
      caps: {maxEndpointsPerService: 50}
";

#[test]
fn a_links_file_loads_with_defaults() {
    let file = LinksFile::from_yaml(GOOD_FILE).expect("good file");
    assert_eq!(file.links.len(), 2);
    assert_eq!(file.links[1].spec.caps.max_endpoints_per_service, 50);
    assert_eq!(file.links[1].spec.caps.max_services, 2000);
    let effective = file.to_yaml().expect("serializes");
    assert_eq!(
        LinksFile::from_yaml(&effective).expect("effective config reloads"),
        file
    );
}

#[test]
fn a_broken_links_file_names_every_field_and_line() {
    let src = "\
links:
  - name: east
    spec:
      remote: {kubeconfigPath: /k}
      rateLimit:
        perLink:
          updatesPerSecond: 0
          burst: 100
  - name: East_1
    spec:
      remote: {kubeconfigPath: /k}
      coalesce: {quiet: 5s}
  - name: east
    spec:
      remote: {kubeconfigPath: /k}
";
    let ConfigError::Invalid(errs) = LinksFile::from_yaml(src).expect_err("broken") else {
        panic!("expected validation errors");
    };
    let got: Vec<(Option<usize>, &str)> = errs
        .iter()
        .map(|e| (e.line, e.error.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some(7), "links[0].spec.rateLimit.perLink.updatesPerSecond"),
            // Defaulted, so not in the file: the nearest written ancestor's line.
            (
                Some(5),
                "links[0].spec.rateLimit.perService.updatesPerSecond"
            ),
            (Some(9), "links[1].name"),
            // `quiet` is on line 12; the error is about it.
            (Some(12), "links[1].spec.coalesce.quiet"),
            (Some(13), "links[2].name"),
        ],
        "{errs:?}"
    );
    let text = ConfigError::Invalid(errs).to_string();
    assert!(text.starts_with("5 problem(s):"), "{text}");
    assert!(
        text.contains("line 13: links[2].name: \"east\" is used by an earlier link"),
        "{text}"
    );
}

#[test]
fn a_file_with_an_unknown_field_is_refused_with_its_line() {
    let src = "links:\n  - name: east\n    spec:\n      remote: {kubeconfigPath: /k}\n      caps: {maxEndpoints: 5}\n";
    let err = LinksFile::from_yaml(src).expect_err("unknown field");
    let msg = err.to_string();
    assert!(msg.contains("unknown field `maxEndpoints`"), "{msg}");
    assert!(msg.contains("line 5"), "{msg}");
}

#[test]
fn the_crd_schema_carries_the_documented_constraints() {
    let crd = crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("links.floodgate.dev"));
    assert_eq!(crd.spec.group, "floodgate.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "Link");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["fgl".to_owned()][..])
    );
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let columns: Vec<&str> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Phase", "Services", "Endpoints", "Holder", "Age"]);

    let schema = serde_json::to_value(&version.schema).expect("schema serializes");
    let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["remote"]));
    let bucket = &spec["properties"]["rateLimit"]["properties"]["perLink"]["properties"];
    assert_eq!(bucket["updatesPerSecond"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(bucket["burst"]["minimum"].as_f64(), Some(1.0));
    let caps = &spec["properties"]["caps"]["properties"];
    assert_eq!(
        caps["maxEndpointsPerService"]["minimum"].as_f64(),
        Some(1.0)
    );
    assert_eq!(caps["maxEndpointsPerService"]["default"], 1000);
    let quiet = &spec["properties"]["coalesce"]["properties"]["quiet"];
    assert_eq!(quiet["pattern"], "^([0-9]+(ns|us|ms|s|m|h))+$");
    assert_eq!(quiet["default"], "100ms");
    let remote = &spec["properties"]["remote"];
    assert_eq!(
        remote["x-kubernetes-validations"][0]["rule"],
        "has(self.kubeconfigSecret) != has(self.kubeconfigPath)"
    );
    let phase = &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"];
    let phases: Vec<&str> = phase["enum"]
        .as_array()
        .expect("enum")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(phases, ["Healthy", "Throttled", "Quarantined", "Degraded"]);
    assert!(
        spec["properties"]["caps"]["properties"]["maxServices"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("Default: 2000")),
        "doc comments become descriptions"
    );
}

#[test]
fn the_committed_crd_is_current() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/crds/links.floodgate.dev.yaml"
    );
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == crd_yaml(),
        "{path} is stale or missing: run `make crds` and commit the result"
    );
}

/// docs/configuration.md's field table is the CRD's field descriptions, word for word.
#[test]
fn the_configuration_reference_matches_the_doc_comments() {
    fn walk(node: &serde_json::Value, path: String, out: &mut Vec<(String, String)>) {
        let leaf = ["services", "perLink", "perService"]
            .iter()
            .any(|l| path.ends_with(l));
        match node["properties"].as_object() {
            Some(props) if !leaf => {
                for (k, v) in props {
                    walk(v, format!("{path}.{k}"), out);
                }
            }
            _ => {
                let d = node["description"].as_str().unwrap_or_default();
                out.push((path, d.split_whitespace().collect::<Vec<_>>().join(" ")));
            }
        }
    }
    let schema = serde_json::to_value(&crd().spec.versions[0].schema).expect("schema");
    let mut fields = Vec::new();
    walk(
        &schema["openAPIV3Schema"]["properties"]["spec"],
        "spec".into(),
        &mut fields,
    );
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs/configuration.md");
    for (path, description) in &fields {
        let row = format!("| `{path}` | {description} |");
        assert!(
            reference.contains(&row),
            "docs/configuration.md lacks or misstates:\n{row}"
        );
    }
    assert!(
        fields.len() >= 15,
        "the walk found the spec's fields: {fields:?}"
    );
}

#[test]
fn the_example_links_file_is_valid() {
    let src = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/examples/links.yaml"
    ))
    .expect("example");
    LinksFile::from_yaml(&src).expect("the shipped example validates");
}
