/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sock_splice.c: the splice guard of the same-node TCP bypass (fmod_ret on
 * security_file_permission).
 *
 * Why: a socket in axon_sock_hash runs tcp_bpf, whose receive path reads the
 * psock queue (the bytes sk_msg.c redirected into it) before the TCP receive
 * queue. splice(2) from a socket goes to tcp_splice_read, which reads the TCP
 * receive queue only: the redirected bytes are never seen, and Go's io.Copy
 * between two TCP conns (splice since Go 1.21) returns n=0 and the data is
 * silently lost. sendfile(2) from a socket into a pipe takes the same path.
 * The guard makes them fail with EINVAL when the socket read from is in the
 * bypass; EINVAL is what callers treat as "splice not supported here" (Go's
 * poll.Splice, HAProxy) and they fall back to read/write, which tcp_bpf
 * serves in order.
 *
 * Where: fmod_ret on the splice syscall itself would be the obvious hook, but
 * the verifier allows fmod_ret only on functions on the error-injection list
 * (CONFIG_FUNCTION_ERROR_INJECTION, off in Debian's kernels) or named
 * security_*. The splice read path checks the input file with
 * security_file_permission(in, MAY_READ) (vfs_splice_read -> rw_verify_area),
 * and so does read(2): the guard acts only while the current task is in one
 * of the syscalls of cfg_splice_nrs (splice and sendfile, numbered for the
 * running architecture by the loader) and only on a MAY_READ of a socket, so
 * read(2), recv(2) and every non-socket file pass untouched (return 0: the
 * hook runs as without the guard).
 *
 * Membership: a socket in a SOCKHASH has a psock in sk_user_data (flag bit
 * SK_USER_DATA_PSOCK) whose link list names each map the socket is in; the
 * guard refuses when one of them is axon_sock_hash (cfg_sock_hash_id: the
 * pinned map's ID, stable across agent restarts, so sockets inserted by an
 * earlier agent are covered too). The psock and its links are read with
 * CO-RE (bpf_probe_read_kernel): a pointer that is not what it should be
 * reads as 0 and the syscall runs.
 *
 * Not needed: splice with the socket as fd_out is a write, which sk_msg.c
 * sees (MAY_WRITE); tee(2) takes two pipes and vmsplice(2) a pipe;
 * sendfile(2) from a socket to a non-pipe and copy_file_range(2) refuse a
 * socket as input themselves. Not covered: io_uring's IORING_OP_SPLICE (no
 * splice syscall on the way; documented limit).
 */
#include "lib/common.h"
#include "lib/sockmap.h"
#include <bpf/bpf_core_read.h>

char __license[] SEC("license") = "Dual BSD/GPL";

/* cfg_sock_hash_id: map ID of axon_sock_hash, set by the loader. 0 (no map
 * has it): refuse nothing. */
volatile const __u32 cfg_sock_hash_id = 0;

/* AXON_SPLICE_NRS: room for the syscall numbers in cfg_splice_nrs. */
#define AXON_SPLICE_NRS 6

/* AXON_SPLICE_NR_NONE: an unused slot of cfg_splice_nrs. No syscall has
 * this number, and it is not the -1 of a task outside a syscall. */
#define AXON_SPLICE_NR_NONE 0xfffffffe

/* cfg_splice_nrs: the numbers of the syscalls that read a file through its
 * splice_read on the running architecture (splice, sendfile; on x86_64 also
 * their ia32 compat numbers), set by the loader from golang.org/x/sys/unix;
 * unused slots AXON_SPLICE_NR_NONE. The defaults match nothing, and with
 * cfg_sock_hash_id 0 (no map has ID 0) nothing is refused, yet the verifier
 * sees the whole program (the verifier report measures it so). */
volatile const __u32 cfg_splice_nrs[AXON_SPLICE_NRS] = {
	AXON_SPLICE_NR_NONE, AXON_SPLICE_NR_NONE, AXON_SPLICE_NR_NONE,
	AXON_SPLICE_NR_NONE, AXON_SPLICE_NR_NONE, AXON_SPLICE_NR_NONE,
};

/* Kernel types, only the members read (CO-RE relocates the offsets against
 * the running kernel's BTF; the ___axon / ___x86 / ___arm64 suffix is
 * dropped for matching). */

/* The user registers of the current syscall (bpf_task_pt_regs): x86 keeps
 * the syscall number in orig_ax, arm64 in syscallno. bpf_core_field_exists
 * picks the one the running kernel has. */
struct pt_regs___x86 {
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

struct pt_regs___arm64 {
	int syscallno;
} __attribute__((preserve_access_index));

struct sock___axon {
	void *sk_user_data;
} __attribute__((preserve_access_index));

struct socket___axon {
	struct sock___axon *sk;
} __attribute__((preserve_access_index));

struct list_head___axon {
	struct list_head___axon *next;
} __attribute__((preserve_access_index));

struct sk_psock___axon {
	struct list_head___axon link; /* the sk_psock_link of each map the socket is in */
} __attribute__((preserve_access_index));

struct bpf_map___axon {
	__u32 id;
} __attribute__((preserve_access_index));

struct sk_psock_link___axon {
	struct list_head___axon list;
	struct bpf_map___axon *map;
} __attribute__((preserve_access_index));

/* security_file_permission's mask bit for a read (include/linux/fs.h). */
#define AXON_MAY_READ 4

/* sk_user_data flag bits (include/net/sock.h): a psock sets
 * SK_USER_DATA_PSOCK; the pointer is the value without the low three bits. */
#define AXON_SK_USER_DATA_PSOCK 4UL
#define AXON_SK_USER_DATA_PTRMASK (~7UL)

/* Maps a socket is in: the guard looks at this many psock links (a socket
 * is in one map of axon's; another tool's maps come on top). */
#define AXON_SPLICE_MAX_LINKS 4

/* The errno splice(2) and sendfile(2) fail with for a bypassed socket. */
#define AXON_EINVAL 22

/* splice_syscall: the current task is in one of the syscalls of
 * cfg_splice_nrs. */
AXON_INLINE int splice_syscall(void)
{
	void *regs = (void *)bpf_task_pt_regs(bpf_get_current_task_btf());
	__u32 nr;

	if (bpf_core_field_exists(((struct pt_regs___x86 *)0)->orig_ax))
		nr = (__u32)BPF_CORE_READ((struct pt_regs___x86 *)regs, orig_ax);
	else if (bpf_core_field_exists(((struct pt_regs___arm64 *)0)->syscallno))
		nr = (__u32)BPF_CORE_READ((struct pt_regs___arm64 *)regs, syscallno);
	else
		return 0;
#pragma unroll
	for (int i = 0; i < AXON_SPLICE_NRS; i++) {
		if (nr == cfg_splice_nrs[i])
			return 1;
	}
	return 0;
}

/* splice_in_bypass: sk has a psock linked to axon_sock_hash. */
AXON_INLINE int splice_in_bypass(struct sock___axon *sk)
{
	unsigned long ud = (unsigned long)BPF_CORE_READ(sk, sk_user_data);
	struct sk_psock___axon *psock;
	struct list_head___axon *head, *pos;
	struct sk_psock_link___axon *l;
	__u32 want = cfg_sock_hash_id;

	if (!(ud & AXON_SK_USER_DATA_PSOCK))
		return 0;
	psock = (void *)(ud & AXON_SK_USER_DATA_PTRMASK);
	head = &psock->link;
	pos = BPF_CORE_READ(psock, link.next);
#pragma unroll
	for (int i = 0; i < AXON_SPLICE_MAX_LINKS; i++) {
		if (!pos || pos == head)
			return 0;
		l = (void *)pos - bpf_core_field_offset(struct sk_psock_link___axon, list);
		if (BPF_CORE_READ(l, map, id) == want)
			return 1;
		pos = BPF_CORE_READ(pos, next);
	}
	return 0;
}

/* axon_sock_splice runs before security_file_permission(file, mask).
 * ctx[0]: the file; ctx[1]: the mask; ctx[2]: the return value so far (an
 * earlier fmod_ret program's). Returns -EINVAL to fail the read, 0 to run
 * the hook as usual. */
SEC("fmod_ret/security_file_permission")
int axon_sock_splice(unsigned long long *ctx)
{
	struct socket___axon *sock;
	int mask = (int)ctx[1];
	int ret = (int)ctx[2];

	if (ret != 0)
		return ret;
	if (!(mask & AXON_MAY_READ) || !splice_syscall())
		return 0;
	sock = (void *)bpf_sock_from_file((void *)ctx[0]);
	if (!sock || !splice_in_bypass(BPF_CORE_READ(sock, sk)))
		return 0;
	sockmap_count(AXON_SM_SPLICE_REFUSED, 1);
	return -AXON_EINVAL;
}
