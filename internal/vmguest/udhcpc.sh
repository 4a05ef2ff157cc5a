#!/bin/busybox sh
# udhcpc's event script in the guest: applies the lease to $interface.
B=/bin/busybox
case "$1" in
deconfig)
	$B ip -4 addr flush dev "$interface"
	;;
bound | renew)
	$B ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.255}" mtu "${mtu:-1500}"
	for r in $router; do
		$B ip route replace default via "$r" dev "$interface"
		break
	done
	;;
esac
exit 0
