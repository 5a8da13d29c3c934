/**
 * The console's client of the public migrator API (`{base}/api/v1/migrator/...`, docs/api.md
 * "Endpoints"): JSON calls that turn `{"error": {code, message, details}}` bodies into
 * {@link ApiError}, and the upload with progress.
 */

/** The API base path: the console is served at `{base}/ui/`, so `{base}` is what precedes `/ui/`. */
export const API_BASE = location.pathname.replace(/\/ui(\/.*)?$/, '')

/** One failing field of a rejected plan (`E_MIG_INVALID_PLAN` `details.issues`). */
export interface FieldIssue {
  path: string
  message: string
}

/** An error answer of the API: its `E_MIG_*` code, message, HTTP status and details. */
export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly status: number,
    readonly details?: { issues?: FieldIssue[]; [k: string]: unknown },
  ) {
    super(message)
  }
}

async function errorOf(res: Response): Promise<ApiError> {
  try {
    const body = (await res.json()) as { error?: { code: string; message: string; details?: ApiError['details'] } }
    if (body.error) return new ApiError(body.error.code, body.error.message, res.status, body.error.details)
  } catch {}
  return new ApiError(`HTTP_${res.status}`, `${res.status} ${res.statusText}`, res.status)
}

/** Calls `method path` (relative to the API base) with an optional JSON body; throws ApiError. */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  let res: Response
  try {
    res = await fetch(API_BASE + path, {
      method,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
  } catch (e) {
    throw new ApiError('E_CONSOLE_OFFLINE', `the migrator is not reachable (${(e as Error).message})`, 0)
  }
  if (!res.ok) throw await errorOf(res)
  if (res.status === 204) return undefined as T
  return (await res.json()) as T
}

/**
 * `POST /uploads` of `file` (multipart field `file`, `sha256` as query parameter) through
 * XMLHttpRequest, which streams the file from disk and reports upload progress in bytes.
 */
export function uploadFile<T>(file: File, sha256: string, onProgress: (sent: number, total: number) => void): Promise<T> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest()
    xhr.open('POST', `${API_BASE}/uploads?sha256=${sha256}`)
    xhr.upload.onprogress = (e) => onProgress(e.loaded, e.lengthComputable ? e.total : file.size)
    xhr.onerror = () => reject(new ApiError('E_CONSOLE_OFFLINE', 'the upload connection failed', 0))
    xhr.onload = () => {
      let body: { error?: { code: string; message: string; details?: ApiError['details'] } } | null = null
      try {
        body = JSON.parse(xhr.responseText)
      } catch {}
      if (xhr.status >= 200 && xhr.status < 300) resolve(body as T)
      else if (body?.error) reject(new ApiError(body.error.code, body.error.message, xhr.status, body.error.details))
      else reject(new ApiError(`HTTP_${xhr.status}`, `upload answered ${xhr.status}`, xhr.status))
    }
    const form = new FormData()
    form.append('file', file, file.name)
    xhr.send(form)
  })
}
