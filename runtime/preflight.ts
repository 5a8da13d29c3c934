/**
 * The server's side of the pre-flight checks (lib/host/doctor.ts): the settings they look at,
 * taken from the resolved configuration, and the start-up report in the log (failing checks as
 * errors, warnings as warnings, each with its fix).
 */
import { runDoctor, type DoctorReport, type DoctorSettings } from '../lib/host/doctor.ts'
import { dataPaths, type Config } from './config.ts'
import type { Logger } from './logger.ts'

/** The doctor's view of `config`. */
export function doctorSettings(config: Config): DoctorSettings {
  const paths = dataPaths(config)
  return {
    sink: config.sink,
    zfsPool: config.zfsPool,
    volumesDir: paths.volumes,
    logsDir: paths.logs,
    keyFile: paths.keyFile,
    importRoot: paths.importRoot,
    libvirtUri: config.libvirtUri,
    domainType: config.domain.type,
    defaultBridge: config.domain.defaultBridge,
    v2vBinary: config.v2v.binary,
    fullImportBinary: config.v2v.fullImportBinary,
    virtioWinIso: config.v2v.virtioWinIso,
    qemuConf: config.qemuConf,
    skipGoShim: config.skipGoShim,
    apiSocket: config.socket,
    apiTcp: { listen: config.listen, tokenFile: paths.tokenFile, basicAuth: config.basicAuth !== null },
  }
}

/** Runs the checks of `config` and logs every one that is not ok (fail: error, warn: warn). */
export async function logPreflight(config: Config, logger: Logger): Promise<DoctorReport> {
  const report = await runDoctor(doctorSettings(config))
  for (const c of report.checks) {
    if (c.status === 'fail') logger.error({ check: c.id, fix: c.fix }, `pre-flight check ${c.id} failed: ${c.found}`)
    else if (c.status === 'warn') logger.warn({ check: c.id, fix: c.fix }, `pre-flight check ${c.id}: ${c.found}`)
  }
  logger.info({ status: report.status, checks: report.checks.length }, 'pre-flight checks done (GET /doctor, migrator doctor)')
  return report
}
