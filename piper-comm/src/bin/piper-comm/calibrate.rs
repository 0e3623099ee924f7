//! placeholder
#[derive(clap::Args)]
pub struct Args {}
pub fn run<C: piper_comm::Communicator>(_w: &C, _t: &piper_comm::Topology, _a: Args) -> Result<(), String> {
    Err("not yet".into())
}
