// Package fuzz runs every tc and XDP program of axon's datapath through
// BPF_PROG_TEST_RUN with random and mutated packets and checks what comes
// out: only documented verdicts, no test-run error, valid checksums and
// lengths on every packet a program let through rewritten (CheckRewrite),
// counters that only grow, and the conntrack/NAT rules of the north-south
// LB after every batch.
//
// The programs share one node: the package's tests load them with the
// real loaders (podpath, bandwidth, nodeport) into one network namespace
// and pin dir, as the agent does, and fill the maps through those loaders,
// so a mutated packet meets the endpoints, limits, Services and flows a
// node has. That is why the harness is a package of its own rather than a
// test file per program package: the LB with pod delivery, the pod
// programs and the policer act on each other's maps, and one node, one
// corpus and one report cover them all.
//
// The non-test files are the parts without a kernel: frame builders
// (packet.go), mutators (mutate.go), the output checker (check.go) and the
// run loop (engine.go). `make fuzz` runs TestFuzzDatapath with 1 000 000
// packets per program; docs/reliability.md ("Fuzzing") states the rules
// and the numbers.
package fuzz
