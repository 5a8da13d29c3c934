/**
 * The NBD protocol's numbers shared by the client (lib/nbd/client.ts) and the live import's
 * server (lib/live-import/nbd-server.ts), as the protocol document names them (the NBD project's
 * `doc/proto.md`: fixed newstyle handshake, structured replies, block status).
 */

/** Handshake magic numbers. */
export const NBDMAGIC = 0x4e42444d41474943n
export const IHAVEOPT = 0x49484156454f5054n
export const REPLY_MAGIC = 0x0003e889045565a9n

/** Transmission magic numbers: requests, simple and structured replies. */
export const REQUEST_MAGIC = 0x25609513
export const SIMPLE_REPLY_MAGIC = 0x67446698
export const STRUCTURED_REPLY_MAGIC = 0x668e33ef

/** Handshake flags of the server (`NBD_FLAG_FIXED_NEWSTYLE`, `NBD_FLAG_NO_ZEROES`). */
export const FLAG_FIXED_NEWSTYLE = 1
export const FLAG_NO_ZEROES = 2

/** Options (`NBD_OPT_*`). */
export const OPT_GO = 7
export const OPT_STRUCTURED_REPLY = 8
export const OPT_SET_META_CONTEXT = 10

/** Option replies (`NBD_REP_*`). */
export const REP_ACK = 1
export const REP_INFO = 3
export const REP_META_CONTEXT = 4

/** Information types of `NBD_REP_INFO` (`NBD_INFO_*`). */
export const INFO_EXPORT = 0
export const INFO_BLOCK_SIZE = 3

/** Commands (`NBD_CMD_*`). */
export const CMD_READ = 0
export const CMD_DISC = 2
export const CMD_BLOCK_STATUS = 7

/** Command flag `NBD_CMD_FLAG_REQ_ONE`: a block status answer of one extent only. */
export const CMD_FLAG_REQ_ONE = 1 << 3

/** Structured reply flag and chunk types (`NBD_REPLY_FLAG_DONE`, `NBD_REPLY_TYPE_*`). */
export const REPLY_FLAG_DONE = 1
export const REPLY_TYPE_OFFSET_DATA = 1
export const REPLY_TYPE_OFFSET_HOLE = 2
export const REPLY_TYPE_BLOCK_STATUS = 5
