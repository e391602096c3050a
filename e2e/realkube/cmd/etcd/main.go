// Command etcd is a single-member etcd server for the real-server test lane, built from
// go.etcd.io/etcd/server/v3/embed: client and peer URLs on loopback, data in --data-dir. It prints
// "ready <client URL>" on stdout once it serves, and stops on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "where etcd keeps its data (required)")
	client := flag.String("listen-client", "127.0.0.1:2379", "client address (host:port)")
	peer := flag.String("listen-peer", "127.0.0.1:2380", "peer address (host:port)")
	flag.Parse()
	if *dataDir == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: etcd --data-dir DIR [--listen-client HOST:PORT] [--listen-peer HOST:PORT]")
		os.Exit(2)
	}
	clientURL, err := url.Parse("http://" + *client)
	if err != nil {
		log.Fatalf("--listen-client: %v", err)
	}
	peerURL, err := url.Parse("http://" + *peer)
	if err != nil {
		log.Fatalf("--listen-peer: %v", err)
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	// The API server of the tests writes a few hundred objects a second at most: keep the
	// history short so the data dir stays small.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "5m"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("starting etcd: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Printf("ready %s\n", clientURL)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		log.Fatal("etcd was not ready within 60 s")
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	case <-sig:
	}
}
