/* server/base/version.h — darkserve's version string (main's `version`, GET
 * /api/version, the system fingerprint). A build may set it with
 * -DDARKSERVE_VERSION="...". */
#ifndef DARKSERVE_SERVER_VERSION_H
#define DARKSERVE_SERVER_VERSION_H

#ifndef DARKSERVE_VERSION
#define DARKSERVE_VERSION "0.1.0"
#endif

#endif
