package main

import "testing"

func TestLoopbackAddrAcceptsOnlyLoopbackHosts(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:50051":      true,
		"127.1.2.3:50051":      true,
		"[::1]:50051":          true,
		"localhost:50051":      true,
		"LocalHost:50051":      true,
		"[::ffff:127.0.0.1]:1": true,
		":50051":               false, // every interface
		"0.0.0.0:50051":        false,
		"[::]:50051":           false,
		"10.0.0.5:50051":       false,
		"128.0.0.1:50051":      false,
		"example.com:50051":    false,
		"localhost.evil:50051": false,
		"127.0.0.1":            false, // no port: not an address to listen on
	} {
		if got := loopbackAddr(addr); got != want {
			t.Errorf("loopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}
