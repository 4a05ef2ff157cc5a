"""variants.py POINT: cut the north-south LB's conntrack-hit path short at POINT.

Inserts `return CTX_IS_XDP ? XDP_TX : TC_ACT_REDIRECT` (3 / 7, the verdict nplbbench expects
for ct_hit) into bpf/lib/nodeport.h at one point of the hit path; "full" changes nothing.
run.sh builds one nplbbench binary per point (the BPF objects are embedded) and restores the
file. Points, in path order:
  P1  after the Ethernet + IP parse (np_ingress)
  P2  before np_ingress_l4 (after the podCIDR, fragment and ICMP branches)
  P3  before the CT lookup (after the ports, the scratch and the clock)
  P4  right after a CT hit in axon_np_ct
  P5  at `hit:` (after the touch and the entry copy), before the hit counter
  P6  in np_forward, SNAT: before the route (next-hop cache) lookup
  P6b after the route lookup, before the rewrite
  P7  after the rewrite, before np_transmit
"""
import sys, re
pt = sys.argv[1]
p = 'bpf/lib/nodeport.h'
s = open(p).read()
R = '{ return CTX_IS_XDP ? 3 : 7; } /*EXP*/'
anchors = {
 'P1': ('\trc = np_parse_l3(ctx, &p);\n\tif (rc) {\n\t\tif (rc < 0)\n\t\t\tnp_count(hook, NP_MALFORMED);\n\t\treturn CTX_NEXT;\n\t}\n', 'after'),
 'P2': ('\trc = np_ingress_l4(ctx, &p, hook);\n', 'before'),
 'P3': ('\tnow = np_now();\n\tctp = bpf_map_lookup_elem(&axon_np_ct, &pp->t);\n', 'before_ctlookup'),
 'P4': ('\tif (ctp && !np_reopens(ctp, pp)) {\n\t\tnp_ct_touch(ctp, pp, now, 0);\n', 'after_lookup'),
 'P5': ('hit:\n\tnp_count(hook, NP_CT_HIT);\n', 'before'),
 'P6': ('\t__builtin_memcpy(n.saddr, src, 16);\n\tn.sport = ct->nat_port;\n\tif (np_route(ctx, p->v6, n.saddr, n.daddr, fp, hook, &rc, &verdict))\n\t\treturn verdict;\n', 'P6'),
 'P6b': ('\tn.sport = ct->nat_port;\n\tif (np_route(ctx, p->v6, n.saddr, n.daddr, fp, hook, &rc, &verdict))\n\t\treturn verdict;\n', 'P6b'),
 'P7': ('\tif (np_rewrite(ctx, p, &n, 1)) {\n\t\treturn np_drop(ctx, hook, NP_REWRITE_FAIL);\n\t}\n\treturn np_transmit(ctx, rc, fp, hook, NP_SNAT_FWD);\n', 'P7'),
}
if pt == 'full':
    sys.exit(0)
a, mode = anchors[pt]
assert s.count(a) == 1, (pt, s.count(a))
if mode == 'after':
    s = s.replace(a, a + '\t' + R + '\n')
elif mode == 'before':
    s = s.replace(a, '\t' + R + '\n' + a) if not a.startswith('hit:') else s.replace(a, 'hit:\n\t' + R + '\n' + a[len('hit:\n'):])
elif mode == 'before_ctlookup':
    s = s.replace(a, '\tnow = np_now();\n\t' + R + '\n\tctp = bpf_map_lookup_elem(&axon_np_ct, &pp->t);\n')
elif mode == 'after_lookup':
    s = s.replace(a, '\tif (ctp && !np_reopens(ctp, pp)) {\n\t\t' + R + '\n\t\tnp_ct_touch(ctp, pp, now, 0);\n')
elif mode == 'P6':
    # before the route lookup (SNAT address done)
    s = s.replace(a, '\t__builtin_memcpy(n.saddr, src, 16);\n\tn.sport = ct->nat_port;\n\t' + R + '\n\tif (np_route(ctx, p->v6, n.saddr, n.daddr, fp, hook, &rc, &verdict))\n\t\treturn verdict;\n')
elif mode == 'P6b':
    s = s.replace(a, a + '\t' + R + '\n')
elif mode == 'P7':
    # after the rewrite, before transmit
    s = s.replace(a, '\tif (np_rewrite(ctx, p, &n, 1)) {\n\t\treturn np_drop(ctx, hook, NP_REWRITE_FAIL);\n\t}\n\t' + R + '\n\treturn np_transmit(ctx, rc, fp, hook, NP_SNAT_FWD);\n')
open(p, 'w').write(s)
