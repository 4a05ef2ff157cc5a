#!/bin/busybox sh
# udhcpc's event script in the guest: applies the lease to $interface.
B=/bin/busybox
case "$1" in
deconfig)
	$B ip -4 addr flush dev "$interface"
	;;
bound | renew)
	$B ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.255}" mtu "${mtu:-1500}"
	if [ -n "$staticroutes" ]; then
		# Classless static routes (option 121; RFC 3442: they replace the router option):
		# pairs of destination/len and gateway, 0.0.0.0 meaning on-link, in the server's order.
		set -- $staticroutes
		while [ $# -ge 2 ]; do
			if [ "$2" = 0.0.0.0 ]; then
				$B ip route replace "$1" dev "$interface" scope link
			else
				$B ip route replace "$1" via "$2" dev "$interface"
			fi
			shift 2
		done
	else
		for r in $router; do
			$B ip route replace default via "$r" dev "$interface"
			break
		done
	fi
	;;
esac
exit 0
