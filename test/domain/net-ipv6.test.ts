// Static IPv6 in every configuration style the inspection reads, carried like IPv4 (gateway6),
// and the address check's neighbour discovery (ndisc6's answer read; the real probe of a guest
// runs in test/engine/real-guests-shapes.guest.integ.test.ts).
import { describe, expect, test } from 'bun:test'
import { writeFileSync } from 'node:fs'
import * as path from 'node:path'
import { checkAddresses, ndiscReplies, probeableAddresses } from '../../lib/domain/address-check.ts'
import { parseIfcfg, parseIfupdown, parseNetplan, parseNetworkd, parseNmKeyfiles } from '../../lib/domain/net-config.ts'
import { destinationNics, planNetworkIdentity } from '../../lib/domain/net-identity.ts'
import { tempDir } from '../helpers/tmp.ts'

const MAC = '00:0c:29:aa:bb:cc'

describe('static IPv6 in each style', () => {
  test('ifupdown: inet6 static with a prefix or a netmask length, gateways kept per family', () => {
    const [e] = parseIfupdown([
      {
        path: '/etc/network/interfaces',
        text: [
          'auto ens192',
          'iface ens192 inet static',
          '    address 198.51.100.10',
          '    netmask 255.255.255.0',
          '    gateway 198.51.100.1',
          'iface ens192 inet6 static',
          '    address 2001:db8:60::10',
          '    netmask 64',
          '    gateway 2001:db8:60::1',
          '',
        ].join('\n'),
      },
    ])
    expect(e).toMatchObject({
      name: 'ens192',
      method: 'static',
      addresses: ['198.51.100.10/24', '2001:db8:60::10/64'],
      gateway: '198.51.100.1',
      gateway6: '2001:db8:60::1',
    })
  })

  test('netplan, NetworkManager, networkd, ifcfg: IPv6 addresses and gateways', () => {
    const [np] = parseNetplan([
      {
        path: '/etc/netplan/50.yaml',
        text: 'network:\n  version: 2\n  ethernets:\n    ens192:\n      addresses: [198.51.100.10/24, "2001:db8:60::10/64"]\n      routes:\n        - to: default\n          via: 198.51.100.1\n        - to: "::/0"\n          via: "2001:db8:60::1"\n',
      },
    ])
    expect(np).toMatchObject({ addresses: ['198.51.100.10/24', '2001:db8:60::10/64'], gateway: '198.51.100.1', gateway6: '2001:db8:60::1' })
    const [nm] = parseNmKeyfiles([
      {
        path: '/etc/NetworkManager/system-connections/ens192.nmconnection',
        text: '[connection]\nid=ens192\ntype=ethernet\ninterface-name=ens192\n\n[ipv4]\nmethod=manual\naddress1=198.51.100.10/24,198.51.100.1\n\n[ipv6]\nmethod=manual\naddress1=2001:db8:60::10/64,2001:db8:60::1\n',
      },
    ])
    expect(nm).toMatchObject({ method: 'static', addresses: ['198.51.100.10/24', '2001:db8:60::10/64'], gateway: '198.51.100.1', gateway6: '2001:db8:60::1' })
    const [nd] = parseNetworkd([
      {
        path: '/etc/systemd/network/10-ens192.network',
        text: '[Match]\nName=ens192\n\n[Network]\nAddress=2001:db8:60::10/64\nGateway=2001:db8:60::1\nAddress=198.51.100.10/24\n',
      },
    ])
    expect(nd).toMatchObject({ addresses: ['2001:db8:60::10/64', '198.51.100.10/24'], gateway: null, gateway6: '2001:db8:60::1' })
    const [rh] = parseIfcfg([
      {
        path: '/etc/sysconfig/network-scripts/ifcfg-ens192',
        text: 'DEVICE=ens192\nBOOTPROTO=none\nIPADDR=198.51.100.10\nPREFIX=24\nGATEWAY=198.51.100.1\nIPV6INIT=yes\nIPV6ADDR=2001:db8:60::10/64\nIPV6ADDR_SECONDARIES="2001:db8:61::10/64"\nIPV6_DEFAULTGW=2001:db8:60::1%ens192\n',
      },
    ])
    expect(rh).toMatchObject({
      addresses: ['198.51.100.10/24', '2001:db8:60::10/64', '2001:db8:61::10/64'],
      gateway: '198.51.100.1',
      gateway6: '2001:db8:60::1',
    })
  })

  test('the job record carries gateway6 beside the addresses', () => {
    const p = planNetworkIdentity(
      {
        interfaces: parseIfupdown([{ path: '/e/i', text: 'iface ens192 inet6 static\n address 2001:db8:60::10/64\n gateway 2001:db8:60::1\n' }]),
        rules: [],
        notes: [],
      },
      destinationNics([{ label: 'ethernet0', mac: MAC, model: 'vmxnet3', network: 'VM Network', pci_slot: 192 }]),
    )
    expect(p.interfaces[0]).toMatchObject({ name: 'ens192', carried: true, addresses: ['2001:db8:60::10/64'], gateway: null, gateway6: '2001:db8:60::1' })
  })
})

describe('the address check by neighbour discovery', () => {
  test("ndisc6's answer and the addresses worth probing (no link-local, no multicast)", () => {
    const out = 'Soliciting 2001:db8:60::10 (2001:db8:60::10) on mig60br0...\nTarget link-layer address: 00:0C:29:AA:BB:CC\n from 2001:db8:60::10\n'
    expect(ndiscReplies(out)).toEqual([MAC])
    expect(ndiscReplies('Soliciting 2001:db8::1 on br0...\nTimed out.\nNo response.\n')).toEqual([])
    expect(probeableAddresses(['198.51.100.10/24', '2001:DB8:60::10/64', 'fe80::1/64', 'ff02::1', 'not-an-ip', '::ffff:zz'])).toEqual([
      { address: '198.51.100.10', family: 4 },
      { address: '2001:db8:60::10', family: 6 },
    ])
  })

  // Shell scripts stand in for arping and ndisc6 here (no guest answers in a unit test).
  const fake = (dir: string, name: string, body: string) => {
    const p = path.join(dir, name)
    writeFileSync(p, `#!/bin/sh\n${body}\n`, { mode: 0o755 })
    return p
  }

  test('an interface with IPv4 and IPv6 is seen only when both answer from its MAC; a v6 that does not answer is not-seen; a missing ndisc6 is said', async () => {
    const t = tempDir('mig-ndisc-')
    try {
      const rec = () =>
        planNetworkIdentity(
          {
            interfaces: parseIfupdown([
              { path: '/e/i', text: 'iface ens192 inet static\n address 198.51.100.10/24\niface ens192 inet6 static\n address 2001:db8:60::10/64\n' },
            ]),
            rules: [],
            notes: [],
          },
          destinationNics([{ label: 'ethernet0', mac: MAC, model: 'vmxnet3', network: 'VM Network', pci_slot: 192 }]),
        ).interfaces[0]!
      const bridgeOf = new Map([[MAC, 'br-test']])
      const arping = fake(t.dir, 'arping', `for a; do last=$a; done\necho "Unicast reply from $last [${MAC}]  1.0ms"; exit 0`)
      const ndiscOk = fake(t.dir, 'ndisc6-ok', `echo "Soliciting $5 ($5) on $6..."\necho "Target link-layer address: ${MAC.toUpperCase()}"\nexit 0`)
      const ndiscNone = fake(t.dir, 'ndisc6-none', 'echo "Timed out."; echo "No response."; exit 1')
      const a = [rec()]
      await checkAddresses(a, { bridgeOf, waitSeconds: 0, arping, ndisc6: ndiscOk })
      expect(a[0]!.address_check).toBe('seen')
      expect(a[0]!.address_evidence).toBe(
        `198.51.100.10 answered an ARP probe on bridge br-test from MAC ${MAC}; 2001:db8:60::10 answered a neighbour solicitation on bridge br-test from MAC ${MAC}`,
      )
      const b = [rec()]
      await checkAddresses(b, { bridgeOf, waitSeconds: 0, arping, ndisc6: ndiscNone })
      expect(b[0]!.address_check).toBe('not-seen')
      expect(b[0]!.address_evidence).toContain('no neighbour advertisement for 2001:db8:60::10 from MAC')
      expect(b[0]!.address_evidence).toContain('198.51.100.10 answered an ARP probe')
      const c = [rec()]
      await checkAddresses(c, { bridgeOf, waitSeconds: 0, arping, ndisc6: path.join(t.dir, 'no-such-ndisc6') })
      expect(c[0]!.address_check).toBe('seen')
      expect(c[0]!.address_evidence).toContain('2001:db8:60::10: neighbour solicitation on bridge br-test failed')
    } finally {
      t.cleanup()
    }
  })
})
