/**
 * CIM operating system types (DMTF CIM schema 2.52, `CIM_OperatingSystem.OSType` ValueMap), as
 * OVF's OperatingSystemSection `ovf:id` carries them (DSP0243 9.7).
 */
import type { GuestFamily } from '../manifest.ts'

/** CIM_OperatingSystem.OSType ValueMap (CIM schema 2.52, values 0-120): description and family. */
const CIM_OS: readonly string[] = [
  'Unknown', 'Other', 'MACOS', 'ATTUNIX', 'DGUX', 'DECNT', 'Tru64 UNIX', 'OpenVMS', 'HPUX', 'AIX',
  'MVS', 'OS400', 'OS/2', 'JavaVM', 'MSDOS', 'WIN3x', 'WIN95', 'WIN98', 'WINNT', 'WINCE',
  'NCR3000', 'NetWare', 'OSF', 'DC/OS', 'Reliant UNIX', 'SCO UnixWare', 'SCO OpenServer', 'Sequent', 'IRIX', 'Solaris',
  'SunOS', 'U6000', 'ASERIES', 'HP NonStop OS', 'HP NonStop OSS', 'BS2000', 'LINUX', 'Lynx', 'XENIX', 'VM',
  'Interactive UNIX', 'BSDUNIX', 'FreeBSD', 'NetBSD', 'GNU Hurd', 'OS9', 'MACH Kernel', 'Inferno', 'QNX', 'EPOC',
  'IxWorks', 'VxWorks', 'MiNT', 'BeOS', 'HP MPE', 'NextStep', 'PalmPilot', 'Rhapsody', 'Windows 2000', 'Dedicated',
  'OS/390', 'VSE', 'TPF', 'Windows (R) Me', 'Caldera Open UNIX', 'OpenBSD', 'Not Applicable', 'Windows XP', 'z/OS', 'Microsoft Windows Server 2003',
  'Microsoft Windows Server 2003 64-Bit', 'Windows XP 64-Bit', 'Windows XP Embedded', 'Windows Vista', 'Windows Vista 64-Bit', 'Windows Embedded for Point of Service', 'Microsoft Windows Server 2008', 'Microsoft Windows Server 2008 64-Bit', 'FreeBSD 64-Bit', 'RedHat Enterprise Linux',
  'RedHat Enterprise Linux 64-Bit', 'Solaris 64-Bit', 'SUSE', 'SUSE 64-Bit', 'SLES', 'SLES 64-Bit', 'Novell OES', 'Novell Linux Desktop', 'Sun Java Desktop System', 'Mandriva',
  'Mandriva 64-Bit', 'TurboLinux', 'TurboLinux 64-Bit', 'Ubuntu', 'Ubuntu 64-Bit', 'Debian', 'Debian 64-Bit', 'Linux 2.4.x', 'Linux 2.4.x 64-Bit', 'Linux 2.6.x',
  'Linux 2.6.x 64-Bit', 'Linux 64-Bit', 'Other 64-Bit', 'Microsoft Windows Server 2008 R2', 'VMware ESXi', 'Microsoft Windows 7', 'CentOS 32-bit', 'CentOS 64-bit', 'Oracle Linux 32-bit', 'Oracle Linux 64-bit',
  'eComStation 32-bitx', 'Microsoft Windows Server 2011', 'Microsoft Windows Server 2012', 'Microsoft Windows 8', 'Microsoft Windows 8 64-bit', 'Microsoft Windows Server 2012 R2', 'Microsoft Windows 8.1', 'Microsoft Windows 8.1 64-bit', 'Microsoft Windows Server 2016', 'Microsoft Windows 10',
  'Microsoft Windows 10 64-bit',
]
const CIM_WINDOWS = new Set([5, 15, 16, 17, 18, 19, 58, 63, 67, 69, 70, 71, 72, 73, 74, 75, 76, 77, 103, 105, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120])
const CIM_LINUX = new Set([36, 79, 80, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 106, 107, 108, 109])

/**
 * Description and guest family of a CIM_OperatingSystem OSType value (the OVF
 * OperatingSystemSection `ovf:id`): Windows ids (WIN3x..Windows 10 64-bit), Linux ids (LINUX,
 * RHEL, SUSE, Ubuntu, Debian, Linux 2.x, CentOS, Oracle Linux, ...), other known ids `other`,
 * 0 / 66 / unknown numbers `unknown`.
 */
export function cimOsType(id: number): { name: string | null; family: GuestFamily } {
  const name = CIM_OS[id] ?? null
  if (CIM_WINDOWS.has(id)) return { name, family: 'windows' }
  if (CIM_LINUX.has(id)) return { name, family: 'linux' }
  if (name === null || id === 0 || id === 66) return { name, family: 'unknown' }
  return { name, family: 'other' }
}
