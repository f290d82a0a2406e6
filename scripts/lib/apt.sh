# Installs Debian packages for the tests and benchmarks without starting the
# services they ship (redis-server, prometheus and nginx each start a daemon
# from their install scripts where an init system runs them): a script must
# not leave behind, nor have to stop, a process it did not start itself.
# Debian's own switch for that is /usr/sbin/policy-rc.d answering 101
# ("action forbidden"); one is put in place for the install when the machine
# has none, and removed after.
#
#   apt_install PKG...

apt_install() {
  local sudo="" made=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod 755 /usr/sbin/policy-rc.d
    made=1
  fi
  local rc=0
  { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } || rc=$?
  [ -z "$made" ] || $sudo rm -f /usr/sbin/policy-rc.d
  return $rc
}
