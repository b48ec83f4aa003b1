// Added to sigs.k8s.io/kube-network-policies' pkg/networkpolicy by hack/build-tools.sh
// (build_netpol): the statement that hands a packet to the enforcer's nfqueue.
//
// Upstream writes nftables' native `queue` expression (expr.Queue), which needs the kernel's
// nft_queue (CONFIG_NFT_QUEUE). The kernel of the developers' and CI's machines has no
// nft_queue and no loadable modules, so that rule is refused ("netlink receive: no such file or
// directory") and the whole nftables transaction with it: nothing is queued, no policy is
// enforced. The kernel does have nfnetlink_queue, nft_compat and the xtables NFQUEUE target
// (CONFIG_NETFILTER_NETLINK_QUEUE, CONFIG_NFT_COMPAT, CONFIG_NETFILTER_XT_TARGET_NFQUEUE): the
// same queueing `iptables-nft -j NFQUEUE` installs. This writes that target, revision 3, in
// place of expr.Queue: the same queue number, one queue, and the bypass flag when fail-open
// (NFQ_FLAG_BYPASS is 0x01 as expr.QueueFlagBypass is). Everything else (the table, sets,
// chains, the nfqueue listener and its verdicts) is upstream's.

package networkpolicy

import (
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

func nfqueueStatement(queueID int, failOpen bool) expr.Any {
	var flags uint16
	if failOpen {
		flags = 0x01 // NFQ_FLAG_BYPASS
	}
	// struct xt_NFQ_info_v3 { __u16 queuenum; __u16 queues_total; __u16 flags; }, native
	// endian, padded to XT_ALIGN (8 bytes).
	info := xt.Unknown(make([]byte, 0, 8))
	info = append(info, binaryutil.NativeEndian.PutUint16(uint16(queueID))...)
	info = append(info, binaryutil.NativeEndian.PutUint16(1)...)
	info = append(info, binaryutil.NativeEndian.PutUint16(flags)...)
	info = append(info, 0, 0)
	return &expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}
