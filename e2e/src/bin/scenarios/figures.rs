//! The report's rows for the side-by-side runs: S1, calm and the cold starts, each figure
//! beside the design's target.

use floodgate_e2e::cold::{ColdOutcome, ColdPlan};
use floodgate_e2e::flood::{Outcome, percentile};
use floodgate_e2e::hub::{HubOutcome, HubPlan};
use floodgate_e2e::replicas::{Failover, Spread};
use floodgate_e2e::report::{Figure, S1, mib};
use floodgate_e2e::resolve::Resolved;
use floodgate_e2e::shapes::{Pair, Shapes};

/// The resolver consumer's figure: ready endpoints served without their pod for more than
/// 2 s (a destination drops them), for the calm services and for the flooder, and what the
/// flooder kept while contained.
fn resolved_figure(what: String, r: &Resolved, contained: bool, out: &mut Vec<Figure>) {
    let flooder = if contained {
        format!(
            "; flooder max {} (end {}), {} ready endpoints while contained",
            r.flooder_settled_max,
            r.flooder_settled_end,
            r.flooder_ready_contained.unwrap_or_default()
        )
    } else {
        String::new()
    };
    out.push(Figure {
        what,
        direct: format!("max {}", r.direct_settled_max),
        floodgate: format!("calm max {}{flooder}", r.calm_settled_max),
        ratio: String::new(),
        target: if contained {
            "0 calm; 0 flooder, >= 1 ready".into()
        } else {
            "0".into()
        },
        met: Some(
            r.looks > 0
                && r.calm_settled_max == 0
                && (!contained
                    || (r.flooder_settled_max == 0
                        && r.flooder_ready_contained.is_some_and(|n| n > 0))),
        ),
    });
}

pub fn calm_figures(o: &Outcome, out: &mut Vec<Figure>) {
    resolved_figure(
        "Calm: ready endpoints without their pod for > 2 s, through Floodgate".into(),
        &o.resolved,
        false,
        out,
    );
    let (direct, via) = (
        percentile(&o.direct_staleness_ms, 0.5),
        percentile(&o.via_staleness_ms, 0.5),
    );
    out.push(Figure {
        what: format!(
            "Calm: a change's delay with no flood, p50 ({} changes)",
            o.via_staleness_ms.len()
        ),
        direct: format!("{direct} ms"),
        floodgate: format!("{via} ms"),
        ratio: format!("+{} ms", via.saturating_sub(direct)),
        target: "within 20 ms of direct".into(),
        met: Some(via <= direct + 20 && o.via_missed == 0),
    });
}

pub fn cold_flood_figures(plan: &ColdPlan, o: &ColdOutcome, out: &mut Vec<Figure>) {
    let what = |f: &str| {
        format!(
            "Cold start during a flood ({} pods, {}): {f}",
            plan.pods, plan.shape
        )
    };
    out.push(Figure::own(
        what("ready"),
        format!("{:.1} s", o.ready_s),
        "<= 10 s",
        Some(o.ready_s <= 10.0),
    ));
    out.push(Figure::own(
        what("a consumer's streaming-list informers synced, after its start"),
        format!("{:.1} s", o.consumer_synced_s),
        "<= 5 s",
        Some(o.consumer_synced_s <= 5.0),
    ));
    let contained = match o.contained_after_s {
        Some(c) => format!("{} after {c:.1} s", o.contained.join(", ")),
        None => "none".to_owned(),
    };
    out.push(Figure::own(
        what("calm services served whole; the flooder contained"),
        format!("{}/3; {contained}", o.calm_served),
        "3/3; prod/injector",
        Some(o.calm_served == 3 && o.contained == ["prod/injector"] && o.phase != "Quarantined"),
    ));
    out.push(Figure::own(
        what("Floodgate peak RSS"),
        mib(o.peak_kib),
        "(reported)",
        None,
    ));
    resolved_figure(
        what("ready endpoints without their pod for > 2 s"),
        &o.resolved,
        true,
        out,
    );
}

pub fn cold_large_figures(plan: &ColdPlan, o: &ColdOutcome, out: &mut Vec<Figure>) {
    let what = |f: &str| {
        format!(
            "Cold start, {} ready pods behind {} exported services{}: {f}",
            plan.pods,
            plan.services,
            if plan.one_body {
                ", each list one body"
            } else {
                ", streaming lists"
            }
        )
    };
    out.push(Figure::own(
        what("Floodgate peak RSS"),
        format!("{} ({} pods served)", mib(o.peak_kib), o.pods_served),
        "<= 128 MiB",
        Some(o.peak_kib <= 128 * 1024),
    ));
    resolved_figure(
        what("ready endpoints without their pod for > 2 s"),
        &o.resolved,
        false,
        out,
    );
    out.push(Figure::own(
        what("Floodgate steady RSS"),
        format!(
            "{} ({:.1} MB of JSON served)",
            mib(o.steady_kib),
            o.view_bytes as f64 / 1e6
        ),
        "<= 64 MiB",
        Some(o.steady_kib <= 64 * 1024),
    ));
}

/// What serving costs: Floodgate's steady RSS beside the JSON it serves, in all and per object.
pub fn cold_wide_figures(plan: &ColdPlan, o: &ColdOutcome, out: &mut Vec<Figure>) {
    let what = |f: &str| {
        format!(
            "Serving {} exported services of {} ready pods, all under the cap: {f}",
            plan.services,
            plan.pods / plan.services.max(1)
        )
    };
    let rss = o.steady_kib as f64 * 1024.0;
    let json = o.view_bytes.max(1) as f64;
    out.push(Figure::own(
        what("Floodgate steady RSS / JSON served"),
        format!(
            "{} / {:.1} MB = {:.1}x",
            mib(o.steady_kib),
            json / 1e6,
            rss / json
        ),
        "< 3x",
        Some(rss < 3.0 * json),
    ));
    let objects = o.objects_served.max(1) as f64;
    out.push(Figure::own(
        what("RSS per served object, beside its JSON"),
        format!(
            "{:.0} B vs {:.0} B of JSON ({} objects)",
            rss / objects,
            json / objects,
            o.objects_served
        ),
        "(reported)",
        None,
    ));
}

pub fn s1_figures(name: &str, o: &Outcome, out: &mut Vec<Figure>) {
    let s1 = S1 {
        direct_events: o.direct_events,
        via_events: o.via_events,
        direct_peak_kib: o.direct_peak_kib,
        via_peak_kib: o.via_peak_kib,
        floodgate_peak_kib: o.floodgate_peak_kib,
        direct_staleness_ms: o.direct_staleness_ms.clone(),
        via_staleness_ms: o.via_staleness_ms.clone(),
        via_missed: o.via_missed,
    };
    floodgate_e2e::report::s1_figures(name, &s1, out);
    resolved_figure(
        format!("S1 {name}: ready endpoints without their pod for > 2 s, through Floodgate"),
        &o.resolved,
        o.contained_after_s.is_some(),
        out,
    );
    if let Some(c) = o.contained_after_s {
        out.push(Figure {
            what: format!(
                "S1 {name}: containment of {}, from the start of the scale-up",
                o.contained.join(", ")
            ),
            direct: "never".into(),
            floodgate: format!("{c:.1} s"),
            ratio: String::new(),
            target: "(reported)".into(),
            met: None,
        });
    }
    if let Some(q) = o.quarantined_after_s {
        out.push(Figure {
            what: format!("S1 {name}: quarantine, from the start of the scale-up"),
            direct: "never".into(),
            floodgate: format!("{q:.1} s"),
            ratio: String::new(),
            target: "(reported)".into(),
            met: None,
        });
    }
}

/// The many-links rows: the start's lists unpaced beside paced, then the paced hub's ready
/// time, memory a link beyond the JSON it serves, and idle CPU.
pub fn hub_figures(
    unpaced: &HubOutcome,
    paced: &HubOutcome,
    empty: &HubOutcome,
    out: &mut Vec<Figure>,
) {
    let n = paced.links;
    let lists = |o: &HubOutcome| {
        format!(
            "{} lists and watches over {:.1} s, at most {} in 100 ms ({}/s)",
            o.lists, o.lists_spread_s, o.lists_peak_per_100ms, o.starts_per_second
        )
    };
    out.push(Figure {
        what: format!("Many links: {n} links start; their lists and watches reach the remote"),
        direct: format!("unpaced: {}", lists(unpaced)),
        floodgate: lists(paced),
        // The spread alone says little on 2 cores (decoding is CPU-bound, so an unpaced start
        // spreads too); the busiest 100 ms says what the remote sees at once.
        ratio: format!(
            "{:.1}x fewer in the busiest 100 ms",
            unpaced.lists_peak_per_100ms as f64 / paced.lists_peak_per_100ms.max(1) as f64
        ),
        target: "spread over >= 2 s".into(),
        met: Some(paced.lists_spread_s >= 2.0),
    });
    out.push(Figure {
        what: format!("Many links: {n} links ready (every link serving)"),
        direct: format!("unpaced: {:.1} s", unpaced.ready_s),
        floodgate: format!("{:.1} s", paced.ready_s),
        ratio: String::new(),
        target: "<= 10 s".into(),
        met: Some(paced.ready_s <= 10.0),
    });
    out.push(Figure {
        what: format!(
            "Many links: RSS a link beyond the JSON it serves ({} objects held upstream in all)",
            paced.upstream_objects
        ),
        direct: String::new(),
        floodgate: format!(
            "{:.2} MiB (RSS {}, of it anonymous {}; JSON served {}, peak {})",
            paced.per_link_beyond_json_kib / 1024.0,
            mib(paced.steady_kib),
            mib(paced.anon_kib),
            mib(paced.view_bytes / 1024),
            mib(paced.peak_kib)
        ),
        ratio: String::new(),
        target: "<= 2 MiB".into(),
        met: Some(paced.per_link_beyond_json_kib <= 2048.0),
    });
    let per_link = |kib: u64| kib as f64 / 1024.0 / empty.links.max(1) as f64;
    out.push(Figure {
        what: format!(
            "Many links: {} links of an empty remote (what a link costs with nothing to serve)",
            empty.links
        ),
        direct: String::new(),
        floodgate: format!(
            "{:.2} MiB a link (RSS {}, of it anonymous {}: {:.2} MiB a link); ready in {:.1} s",
            per_link(empty.steady_kib),
            mib(empty.steady_kib),
            mib(empty.anon_kib),
            per_link(empty.anon_kib),
            empty.ready_s
        ),
        ratio: String::new(),
        target: String::new(),
        met: None,
    });
    out.push(Figure {
        what: format!("Many links: idle CPU of {n} links"),
        direct: String::new(),
        floodgate: format!("{:.2}% of a core", paced.idle_cpu_percent),
        ratio: String::new(),
        target: "<= 1%".into(),
        met: Some(paced.idle_cpu_percent <= 1.0),
    });
}

/// The replicas rows: the remote's watches a link with one replica and with more, a failover
/// by SIGKILL as a consumer of a follower sees it, and links moving as replicas come and go.
pub fn replica_figures(f: &Failover, s: &Spread, out: &mut Vec<Figure>) {
    let lease = floodgate_e2e::replicas::LEASE.as_secs_f64();
    out.push(Figure {
        what: "Replicas: the remote's open watches (1 link; 4 links)".into(),
        direct: format!(
            "one replica: {}; {}",
            f.watches_one_replica, s.watches_one_replica
        ),
        floodgate: format!(
            "at most, with 3 replicas through a SIGKILL: {}; with 3, then 4, then one SIGKILLed: \
             {} (the admin APIs' upstreamWatchers, holder first: {:?})",
            f.watches_most, s.watches_most, f.upstream_watchers
        ),
        ratio: format!(
            "{:.1}x; {:.1}x",
            f.watches_most as f64 / f.watches_one_replica.max(1) as f64,
            s.watches_most as f64 / s.watches_one_replica.max(1) as f64
        ),
        target: "1.0x (one watch per resource per link)".into(),
        met: Some(
            f.watches_most == f.watches_one_replica && s.watches_most == s.watches_one_replica,
        ),
    });
    out.push(Figure {
        what: format!("Replicas: failover by SIGKILL ({lease:.0} s Leases)"),
        direct: String::new(),
        floodgate: format!(
            "Lease taken {:.1} s after the SIGKILL; a remote change made then reached a \
             consumer of a follower {:.1} s later",
            f.lease_taken_s, f.change_reached_s
        ),
        ratio: String::new(),
        target: format!("change within the Lease + 5 s ({:.0} s)", lease + 5.0),
        met: Some(f.change_reached_s <= lease + 5.0),
    });
    let beyond = f.events.iter().filter(|e| *e != "ADDED api").count();
    out.push(Figure {
        what: "Replicas: events a consumer of a follower saw in a failover beyond the real change"
            .into(),
        direct: String::new(),
        floodgate: format!(
            "{beyond} ({:?}); reopened on another replica from its last version: {:?}",
            f.events, f.resumed_on_another
        ),
        ratio: String::new(),
        target: "0, and a resume elsewhere (no 410)".into(),
        met: Some(beyond == 0 && f.resumed_on_another == ["ADDED billing"]),
    });
    out.push(Figure {
        what: "Replicas: 4 links; a 4th replica joins, then one of 4 is SIGKILLed".into(),
        direct: String::new(),
        floodgate: format!(
            "joined (holds a link) {:.1} s after ready; a SIGKILLed replica's link held by \
             another {:.1} s after",
            s.joined_s, s.moved_s
        ),
        ratio: String::new(),
        target: format!("join <= {:.0} s; move <= {:.0} s", 2.0 * lease, 2.0 * lease),
        met: Some(s.joined_s <= 2.0 * lease && s.moved_s <= 2.0 * lease),
    });
}

/// The many-small-services row: a fresh Floodgate's resident memory beside the JSON it serves.
pub fn small_services_figures(plan: &HubPlan, o: &HubOutcome, out: &mut Vec<Figure>) {
    let ratio = o.steady_kib as f64 * 1024.0 / o.view_bytes.max(1) as f64;
    out.push(Figure {
        what: format!(
            "Many small services: {} exported services of {} EndpointSlices of 10 endpoints, no \
             pods ({} objects held upstream)",
            plan.services, plan.slices, o.upstream_objects
        ),
        direct: String::new(),
        floodgate: format!(
            "RSS {} beside {} of JSON served (peak {}; anonymous {}: {:.1}x the JSON); ready \
             in {:.1} s; {} pods fetched one by one",
            mib(o.steady_kib),
            mib(o.view_bytes / 1024),
            mib(o.peak_kib),
            mib(o.anon_kib),
            o.anon_kib as f64 * 1024.0 / o.view_bytes.max(1) as f64,
            o.ready_s,
            o.pods_fetched
        ),
        ratio: format!("{ratio:.1}x the JSON"),
        target: "<= 2x".into(),
        met: Some(ratio <= 2.0),
    });
}

/// The shapes a real cluster makes, judged at the slice event: per path, one row per shape,
/// the scale-up against guarantee 9's target (direct + 50 ms at p99, no address lost).
pub fn shapes_figures(runs: &[&Shapes], out: &mut Vec<Figure>) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    for s in runs {
        let lost = format!(
            "; {} addresses lost at the event ({} direct)",
            s.lost_through, s.lost_direct
        );
        let rows: [(&str, &Pair, bool); 4] = [
            ("scale-up 3 -> 10 one pod at a time, p99", &s.scale_up, true),
            ("burst 10 -> 200", &s.burst, false),
            ("scale-down 200 -> 5", &s.shrink, false),
            (
                "rolling update of 5 to a new ReplicaSet, p99",
                &s.rollout,
                false,
            ),
        ];
        for (shape, p, judged) in rows {
            let extra = ms(p.through) - ms(p.direct);
            out.push(Figure {
                what: format!(
                    "Shapes at the slice event ({}): {shape}, from the slice's write",
                    s.path
                ),
                direct: format!("{:.1} ms", ms(p.direct)),
                floodgate: format!(
                    "{:.1} ms{}",
                    ms(p.through),
                    if judged { lost.as_str() } else { "" }
                ),
                ratio: format!("{extra:+.1} ms"),
                target: if judged {
                    "direct + 50 ms, 0 lost".into()
                } else {
                    "0 lost".into()
                },
                met: Some(s.lost_through == 0 && (!judged || extra <= 50.0)),
            });
        }
    }
}
