/** The input builders live in fixtures/inputs.ts (shared with the demo and benchmarks). */
import { copyFileSync, mkdirSync, statSync } from 'node:fs'
import * as path from 'node:path'
import { type BuiltInput, convert } from '../../fixtures/inputs.ts'
import { CORPUS } from './tmp.ts'

export * from '../../fixtures/inputs.ts'

/**
 * A Hyper-V export folder `<root>/<name>` (`Virtual Machines/`, `Virtual Hard Disks/`): the corpus
 * VMCX (dissect.hypervisor/test.vmcx, a Gen 1 VM that attaches "...\Virtual Hard Disks\Other
 * Location.vhdx" on IDE 0:0) and that VHDX made from the raw image `raw` with
 * `qemu-img convert -O vhdx`.
 */
export function buildVmcxExport(root: string, name: string, raw: string): BuiltInput {
  const dir = path.join(root, name)
  mkdirSync(path.join(dir, 'Virtual Machines'), { recursive: true })
  mkdirSync(path.join(dir, 'Virtual Hard Disks'), { recursive: true })
  copyFileSync(path.join(CORPUS, 'dissect.hypervisor/test.vmcx'), path.join(dir, 'Virtual Machines', '282874FC-59D6-4F30-BC04-5FDD909C82E0.vmcx'))
  convert(raw, 'vhdx', path.join(dir, 'Virtual Hard Disks', 'Other Location.vhdx'))
  return { kind: 'vmcx_export', name, path: dir, disks: [{ raw, capacity: statSync(raw).size }] }
}
