// The guest network configuration parsers (each style) and the network identity plan: which
// configured interface goes to which destination NIC, and the .link file that pins its name.
import { describe, expect, test } from 'bun:test'
import { writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { arpingReplies, checkAddresses } from '../../lib/domain/address-check.ts'
import {
  ifupdownIncludes,
  parseIfcfg,
  parseIfupdown,
  parseLinkFiles,
  parseNetplan,
  parseNetworkd,
  parseNmKeyfiles,
  parseUdevNetRules,
  prefixOfNetmask,
} from '../../lib/domain/net-config.ts'
import type { CarriedInterface } from '../../lib/job.ts'
import { destinationNics, linkFileFor, planNetworkIdentity, type GuestNetwork } from '../../lib/domain/net-identity.ts'
import { tempDir } from '../helpers/tmp.ts'

const VMX_MAC = '00:0c:29:aa:bb:cc'

describe('ifupdown', () => {
  const main = {
    path: '/etc/network/interfaces',
    text: '# comment\nsource /etc/network/interfaces.d/*\nsource-directory extra\n\nauto lo\niface lo inet loopback\n',
  }
  const ens192 = {
    path: '/etc/network/interfaces.d/ens192',
    text: [
      'auto ens192',
      'iface ens192 inet static',
      '    address 192.0.2.10',
      '    netmask 255.255.255.0',
      '    gateway 192.0.2.1',
      '    dns-nameservers 192.0.2.53 192.0.2.54',
      '    up ip route add 198.51.100.0/24 via 192.0.2.254',
      '    post-up route add -net 203.0.113.0 netmask 255.255.255.0 gw 192.0.2.253',
      'iface ens192 inet6 static',
      '    address 2001:db8::10/64',
      '',
      'allow-hotplug ens224',
      'iface ens224 inet dhcp',
      'auto br0',
      'iface br0 inet manual',
      '    bridge_ports ens256',
    ].join('\n'),
  }

  test('includes: source globs and source-directory, relative to /etc/network', () => {
    expect(ifupdownIncludes(main.text)).toEqual([
      { kind: 'glob', path: '/etc/network/interfaces.d/*' },
      { kind: 'dir', path: '/etc/network/extra' },
    ])
  })

  test('static with netmask, gateway, DNS, routes from up/post-up, inet6 address; dhcp; bridge ports; lo dropped', () => {
    const got = parseIfupdown([main, ens192])
    expect(got.map((g) => [g.name, g.method])).toEqual([
      ['ens192', 'static'],
      ['ens224', 'dhcp'],
      ['br0', 'manual'],
      ['ens256', 'manual'],
    ])
    expect(got[0]).toMatchObject({
      style: 'ifupdown',
      file: '/etc/network/interfaces.d/ens192',
      addresses: ['192.0.2.10/24', '2001:db8::10/64'],
      gateway: '192.0.2.1',
      dns: ['192.0.2.53', '192.0.2.54'],
      routes: ['198.51.100.0/24 via 192.0.2.254', '203.0.113.0/24 via 192.0.2.253'],
    })
  })

  test('netmask to prefix', () => {
    expect(prefixOfNetmask('255.255.255.0')).toBe(24)
    expect(prefixOfNetmask('255.255.254.0')).toBe(23)
    expect(prefixOfNetmask('255.0.255.0')).toBeNull()
    expect(prefixOfNetmask('16')).toBe(16)
  })
})

describe('netplan', () => {
  test('by name, by MAC with set-name, routes and default via, nameservers, dhcp; broken YAML ignored', () => {
    const got = parseNetplan([
      {
        path: '/etc/netplan/50-cloud-init.yaml',
        text: [
          'network:',
          '  version: 2',
          '  ethernets:',
          '    ens192:',
          '      addresses: [192.0.2.10/24]',
          '      routes:',
          '        - to: default',
          '          via: 192.0.2.1',
          '        - to: 198.51.100.0/24',
          '          via: 192.0.2.254',
          '      nameservers:',
          '        addresses: [192.0.2.53]',
          '    lan:',
          '      match:',
          `        macaddress: "${VMX_MAC.toUpperCase()}"`,
          '      set-name: lan0',
          '      dhcp4: true',
          '    any:',
          '      match:',
          '        name: "en*"',
          '      dhcp4: yes',
        ].join('\n'),
      },
      { path: '/etc/netplan/bad.yaml', text: 'network: [unclosed' },
    ])
    expect(got.map((g) => [g.name, g.mac, g.method])).toEqual([
      ['ens192', null, 'static'],
      ['lan0', VMX_MAC, 'dhcp'],
      [null, null, 'dhcp'],
    ])
    expect(got[0]).toMatchObject({ addresses: ['192.0.2.10/24'], gateway: '192.0.2.1', routes: ['198.51.100.0/24 via 192.0.2.254'], dns: ['192.0.2.53'] })
  })
})

describe('NetworkManager keyfiles', () => {
  test('manual ipv4 with address1 gateway, dns, route; mac-address; non-ethernet skipped', () => {
    const got = parseNmKeyfiles([
      {
        path: '/etc/NetworkManager/system-connections/Wired.nmconnection',
        text: [
          '[connection]',
          'id=Wired',
          'type=ethernet',
          'interface-name=ens192',
          '',
          '[ethernet]',
          `mac-address=${VMX_MAC.toUpperCase()}`,
          '',
          '[ipv4]',
          'method=manual',
          'address1=192.0.2.10/24,192.0.2.1',
          'dns=192.0.2.53;192.0.2.54;',
          'route1=198.51.100.0/24,192.0.2.254',
        ].join('\n'),
      },
      { path: '/etc/NetworkManager/system-connections/wifi.nmconnection', text: '[connection]\ntype=wifi\ninterface-name=wlan0\n' },
    ])
    expect(got).toHaveLength(1)
    expect(got[0]).toMatchObject({
      style: 'networkmanager',
      name: 'ens192',
      mac: VMX_MAC,
      method: 'static',
      addresses: ['192.0.2.10/24'],
      gateway: '192.0.2.1',
      dns: ['192.0.2.53', '192.0.2.54'],
      routes: ['198.51.100.0/24 via 192.0.2.254'],
    })
  })
})

describe('RHEL ifcfg', () => {
  test('static with NETMASK and quotes, HWADDR, DNSn; dhcp; ifcfg-lo skipped', () => {
    const got = parseIfcfg([
      {
        path: '/etc/sysconfig/network-scripts/ifcfg-ens192',
        text: [
          'TYPE=Ethernet',
          'BOOTPROTO="none"',
          'DEVICE=ens192',
          'ONBOOT=yes',
          `HWADDR=${VMX_MAC}`,
          'IPADDR=192.0.2.10',
          "NETMASK='255.255.255.0'",
          'GATEWAY=192.0.2.1',
          'DNS1=192.0.2.53',
        ].join('\n'),
      },
      { path: '/etc/sysconfig/network-scripts/ifcfg-eth1', text: 'BOOTPROTO=dhcp\nONBOOT=yes\n' },
      { path: '/etc/sysconfig/network-scripts/ifcfg-lo', text: 'DEVICE=lo\nIPADDR=127.0.0.1\n' },
    ])
    expect(got.map((g) => [g.name, g.mac, g.method, g.addresses, g.gateway, g.dns])).toEqual([
      ['ens192', VMX_MAC, 'static', ['192.0.2.10/24'], '192.0.2.1', ['192.0.2.53']],
      ['eth1', null, 'dhcp', [], null, []],
    ])
  })
})

describe('systemd-networkd', () => {
  test('.network by name with [Address] and [Route]; by MAC; globs bind nothing', () => {
    const got = parseNetworkd([
      {
        path: '/etc/systemd/network/10-ens192.network',
        text: [
          '[Match]',
          'Name=ens192',
          '[Network]',
          'Address=192.0.2.10/24',
          'Gateway=192.0.2.1',
          'DNS=192.0.2.53',
          '[Address]',
          'Address=192.0.2.11/24',
          '[Route]',
          'Destination=198.51.100.0/24',
          'Gateway=192.0.2.254',
        ].join('\n'),
      },
      { path: '/etc/systemd/network/20-mac.network', text: `[Match]\nMACAddress=${VMX_MAC}\n[Network]\nDHCP=yes\n` },
      { path: '/etc/systemd/network/99-all.network', text: '[Match]\nName=en*\n[Network]\nDHCP=yes\n' },
    ])
    expect(got.map((g) => [g.name, g.mac, g.method])).toEqual([
      ['ens192', null, 'static'],
      [null, VMX_MAC, 'dhcp'],
    ])
    expect(got[0]).toMatchObject({
      addresses: ['192.0.2.10/24', '192.0.2.11/24'],
      gateway: '192.0.2.1',
      dns: ['192.0.2.53'],
      routes: ['198.51.100.0/24 via 192.0.2.254'],
    })
  })

  test('naming rules: .link files and persistent-net udev rules', () => {
    expect(parseLinkFiles([{ path: '/etc/systemd/network/10-lan.link', text: `[Match]\nMACAddress=${VMX_MAC}\n[Link]\nName=lan0\n` }])).toEqual([
      { file: '/etc/systemd/network/10-lan.link', mac: VMX_MAC, name: 'lan0' },
    ])
    const rules = `# generated\nSUBSYSTEM=="net", ACTION=="add", DRIVERS=="?*", ATTR{address}=="${VMX_MAC}", ATTR{type}=="1", KERNEL=="eth*", NAME="eth0"\n`
    expect(parseUdevNetRules([{ path: '/etc/udev/rules.d/70-persistent-net.rules', text: rules }])).toEqual([
      { file: '/etc/udev/rules.d/70-persistent-net.rules', mac: VMX_MAC, name: 'eth0' },
    ])
  })
})

describe('planNetworkIdentity', () => {
  const staticEns192 = parseIfupdown([
    { path: '/etc/network/interfaces.d/ens192', text: 'auto ens192\niface ens192 inet static\n address 192.0.2.10/24\n gateway 192.0.2.1\n' },
  ])
  const net = (over: Partial<GuestNetwork> = {}): GuestNetwork => ({ interfaces: staticEns192, rules: [], notes: [], ...over })
  const vmxNic = { label: 'ethernet0', mac: VMX_MAC, model: 'vmxnet3', network: 'VM Network', pci_slot: 192 }

  test('ens192 matched by the VMX slot: a .link file naming the kept MAC ens192', () => {
    const p = planNetworkIdentity(
      net(),
      destinationNics([{ label: 'ethernet1', mac: '00:0c:29:00:00:01', model: 'vmxnet3', network: null, pci_slot: 224 }, vmxNic]),
    )
    expect(p.problems).toEqual([])
    expect(p.interfaces).toHaveLength(1)
    expect(p.interfaces[0]).toMatchObject({
      name: 'ens192',
      mac: VMX_MAC,
      nic: 'ethernet0',
      carried: true,
      how: 'link-file',
      matched_by: 'slot',
      link_file: '/etc/systemd/network/10-migrator-ens192.link',
      addresses: ['192.0.2.10/24'],
      gateway: '192.0.2.1',
      config: ['ifupdown:/etc/network/interfaces.d/ens192'],
    })
    expect(p.writes).toEqual([linkFileFor('ens192', VMX_MAC)])
    expect(p.writes[0]!.content).toContain(`[Match]\nMACAddress=${VMX_MAC}\nPath=pci-*\n\n[Link]\nName=ens192\n`)
  })

  test('no slot in the descriptor: the only NIC', () => {
    const p = planNetworkIdentity(net(), destinationNics([{ ...vmxNic, pci_slot: undefined }]))
    expect(p.interfaces[0]).toMatchObject({ carried: true, matched_by: 'only-nic', how: 'link-file' })
  })

  test('a configured interface no NIC matches is a problem, never silence', () => {
    const p = planNetworkIdentity(
      net(),
      destinationNics([
        { ...vmxNic, pci_slot: 160 },
        { ...vmxNic, label: 'ethernet1', mac: '00:0c:29:00:00:02', pci_slot: 224 },
      ]),
    )
    expect(p.writes).toEqual([])
    expect(p.interfaces[0]).toMatchObject({ carried: false, how: null })
    expect(p.problems).toEqual([
      'configured interface ens192 (ifupdown:/etc/network/interfaces.d/ens192) cannot be carried over: no NIC of the destination matches the name ens192 (2 NIC(s): ethernet0 slot 160, ethernet1 slot 224)',
    ])
  })

  test('a NIC without MAC cannot be pinned (problem); a guest rule pins by itself (nothing written); MAC-only config needs the MAC', () => {
    expect(planNetworkIdentity(net(), destinationNics([{ ...vmxNic, mac: null }])).problems[0]).toContain('has no MAC in the source')
    const rule = planNetworkIdentity(net({ rules: [{ file: '/etc/systemd/network/10-x.link', mac: VMX_MAC, name: 'ens192' }] }), destinationNics([vmxNic]))
    expect(rule.writes).toEqual([])
    expect(rule.interfaces[0]).toMatchObject({ carried: true, how: 'guest-rule', matched_by: 'guest-rule' })
    const byMac = parseNetworkd([{ path: '/etc/systemd/network/m.network', text: `[Match]\nMACAddress=${VMX_MAC}\n[Network]\nAddress=192.0.2.10/24\n` }])
    const m = planNetworkIdentity(net({ interfaces: byMac }), destinationNics([vmxNic]))
    expect(m.writes).toEqual([])
    expect(m.interfaces[0]).toMatchObject({ name: null, carried: true, how: 'mac' })
    expect(planNetworkIdentity(net({ interfaces: byMac }), destinationNics([{ ...vmxNic, mac: '00:0c:29:00:00:09' }])).problems[0]).toContain(
      `no NIC of the destination has MAC ${VMX_MAC}`,
    )
  })

  test('eth1 goes to the second NIC; a name configured in two files is one interface; a name .link cannot give is refused', () => {
    const eth = parseIfcfg([{ path: '/etc/sysconfig/network-scripts/ifcfg-eth1', text: 'DEVICE=eth1\nIPADDR=192.0.2.20\nPREFIX=24\n' }])
    const nics = destinationNics([vmxNic, { ...vmxNic, label: 'ethernet1', mac: '00:0c:29:00:00:02', pci_slot: 224 }])
    const p = planNetworkIdentity(net({ interfaces: [...eth, ...eth] }), nics)
    expect(p.interfaces).toHaveLength(1)
    expect(p.interfaces[0]).toMatchObject({ name: 'eth1', nic: 'ethernet1', matched_by: 'eth-index', mac: '00:0c:29:00:00:02' })
    const bad = planNetworkIdentity(net({ interfaces: [{ ...staticEns192[0]!, name: 'a/b' }] }), destinationNics([vmxNic]))
    expect(bad.writes).toEqual([])
    expect(bad.problems[0]).toContain('is not an interface name')
  })
})

describe('checkAddresses (after the boot)', () => {
  const rec = (over: Partial<CarriedInterface> = {}): CarriedInterface => ({
    ...planNetworkIdentity(
      { interfaces: parseIfupdown([{ path: '/e/i', text: 'iface ens192 inet static\n address 192.0.2.10/24\n' }]), rules: [], notes: [] },
      destinationNics([{ label: 'ethernet0', mac: VMX_MAC, model: 'vmxnet3', network: 'VM Network', pci_slot: 192 }]),
    ).interfaces[0]!,
    ...over,
  })

  test("arping's replies are read with their MACs", () => {
    const out =
      'ARPING 192.0.2.10 from 0.0.0.0 br0\nUnicast reply from 192.0.2.10 [00:0C:29:AA:BB:CC]  0.784ms\nSent 1 probes (1 broadcast(s))\nReceived 1 response(s)\n'
    expect(arpingReplies(out)).toEqual([VMX_MAC])
    expect(arpingReplies('Sent 1 probes\nReceived 0 response(s)\n')).toEqual([])
  })

  // A shell script stands in for arping here (no guest answers in a unit test); the real probe
  // runs in test/engine/real-guests.guest.integ.test.ts.
  const fake = (dir: string, mac: string | null) => {
    const p = path.join(dir, `arping-${mac ?? 'none'}`)
    writeFileSync(
      p,
      `#!/bin/sh\nfor a; do last=$a; done\n${mac ? `echo "Unicast reply from $last [${mac}]  1.0ms"; exit 1` : 'echo "Received 0 response(s)"; exit 0'}\n`,
      { mode: 0o755 },
    )
    return p
  }

  test('seen only when the NIC MAC answers; another MAC is not-seen; no bridge, DHCP and a missing arping are not-checked', async () => {
    const t = tempDir('mig-arping-')
    try {
      const bridgeOf = new Map([[VMX_MAC, 'br-test']])
      const a = [rec()]
      await checkAddresses(a, { bridgeOf, waitSeconds: 0, arping: fake(t.dir, VMX_MAC.toUpperCase()) })
      expect([a[0]!.address_check, a[0]!.address_evidence]).toEqual(['seen', `192.0.2.10 answered an ARP probe on bridge br-test from MAC ${VMX_MAC}`])
      const b = [rec()]
      await checkAddresses(b, { bridgeOf, waitSeconds: 0, arping: fake(t.dir, '52:54:00:00:00:01') })
      expect(b[0]!.address_check).toBe('not-seen')
      expect(b[0]!.address_evidence).toContain('answered by other MACs: 52:54:00:00:00:01')
      const c = [rec(), rec({ method: 'dhcp', addresses: [] })]
      await checkAddresses(c, { bridgeOf: new Map(), waitSeconds: 0, arping: fake(t.dir, VMX_MAC) })
      expect(c.map((x) => x.address_check)).toEqual(['not-checked', 'not-checked'])
      expect(c[0]!.address_evidence).toContain('qemu user networking')
      expect(c[1]!.address_evidence).toContain('DHCP')
      const d = [rec()]
      await checkAddresses(d, { bridgeOf, waitSeconds: 0, arping: path.join(t.dir, 'no-such-arping') })
      expect(d[0]!.address_check).toBe('not-checked')
      expect(d[0]!.address_evidence).toContain('ARP probe on bridge br-test failed')
    } finally {
      t.cleanup()
    }
  })
})
