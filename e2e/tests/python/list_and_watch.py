"""The Python `kubernetes` client against a Floodgate link: list services, then follow them with
watch.Watch().stream. Prints one line per fact for the Rust test that drives it:
LISTED <names>, WATCHING, then EVENT <TYPE> <name> for each event, until it has seen
the number of events asked for (argv[2]) or its watch times out."""

import sys

from kubernetes import client, config, watch


def main() -> None:
    kubeconfig, wanted = sys.argv[1], int(sys.argv[2])
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()
    listed = v1.list_namespaced_service("prod")
    names = sorted(s.metadata.name for s in listed.items)
    print("LISTED " + ",".join(names), flush=True)
    print("WATCHING", flush=True)
    seen = 0
    w = watch.Watch()
    for event in w.stream(
        v1.list_namespaced_service,
        "prod",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=20,
    ):
        print(f"EVENT {event['type']} {event['object'].metadata.name}", flush=True)
        seen += 1
        if seen >= wanted:
            w.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
